//! The approval policy in front of the engine: rules by tool and argv prefix (as Codex's exec
//! policy), answers "approve for this session" remembered per session, and the record of who
//! decided.
//!
//! The order, for one request:
//! 1. Every rule whose tool matches and whose `argv_prefix` starts the request's argv (a rule
//!    without one matches any request of the tool) applies; the strictest wins:
//!    `forbid` > `ask` > `allow`. `forbid` denies without asking anyone; `allow` approves.
//! 2. Otherwise, a tool that needs approval (T2, T3, or any tool an `ask` rule names) is
//!    approved when an earlier answer in the same session approved it for the session: the
//!    same tool, with an argv that starts with the argv approved then.
//! 3. Otherwise the engine decides; an answer [`ApprovalDecision::ApprovedForSession`] is
//!    remembered for step 2.
//! 4. A T0 or T1 tool no rule names runs without a decision.

use super::{ApprovalContext, ApprovalDecision, ApprovalEngine, ApprovalRequest};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Instant;

/// What a rule does with the requests it matches.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    /// Approve without asking.
    Allow,
    /// Ask the engine, whatever the tool's tier.
    Ask,
    /// Deny without asking.
    Forbid,
}

/// One rule of the policy.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRule {
    /// The tool it is about.
    pub tool: String,
    /// The argv it matches starts with these words (`["git", "push"]`); none: every request of
    /// the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv_prefix: Option<Vec<String>>,
    /// What it does.
    pub action: RuleAction,
}

impl ApprovalRule {
    fn matches(&self, request: &ApprovalRequest) -> bool {
        self.tool == request.tool_name
            && match (&self.argv_prefix, &request.argv) {
                (None, _) => true,
                (Some(prefix), Some(argv)) => argv.starts_with(prefix),
                (Some(_), None) => false,
            }
    }

    /// How the log names it: `shell ["git","push"] ask`.
    fn describe(&self) -> String {
        let action = match self.action {
            RuleAction::Allow => "allow",
            RuleAction::Ask => "ask",
            RuleAction::Forbid => "forbid",
        };
        match &self.argv_prefix {
            Some(p) => format!(
                "{} {} {action}",
                self.tool,
                serde_json::to_string(p).unwrap_or_default()
            ),
            None => format!("{} {action}", self.tool),
        }
    }
}

/// One decision and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decided {
    /// The answer.
    pub decision: ApprovalDecision,
    /// Who or what decided: `rule: shell ["rm"] forbid`, `session` (an earlier answer),
    /// or the engine's [`ApprovalEngine::name`].
    pub decided_by: String,
    /// How long the engine (a person, perhaps) took, in milliseconds; 0 for rules.
    pub wait_ms: u64,
}

/// What the rules and a session's earlier answers say of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    /// It needs no decision (a T0 or T1 tool no rule names).
    NotNeeded,
    /// A rule or an earlier answer decided it.
    Decided(Decided),
    /// The engine decides: `asked_by` says why (`tier T2`, or the `ask` rule).
    Ask {
        /// Why it needs a decision.
        asked_by: String,
    },
}

/// A session's standing approval of a tool and argv prefix.
#[derive(Clone, Debug)]
struct Grant {
    tool: String,
    argv_prefix: Option<Vec<String>>,
}

/// Rules and session answers in front of an engine. Shared across threads.
pub struct ApprovalPolicy {
    rules: Vec<ApprovalRule>,
    engine: std::sync::Arc<dyn ApprovalEngine>,
    grants: Mutex<HashMap<String, Vec<Grant>>>,
    deadline: Option<std::time::Duration>,
}

impl std::fmt::Debug for ApprovalPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalPolicy")
            .field("rules", &self.rules)
            .field("engine", &self.engine.name())
            .finish_non_exhaustive()
    }
}

impl ApprovalPolicy {
    /// `rules` checked before `engine`.
    pub fn new(rules: Vec<ApprovalRule>, engine: std::sync::Arc<dyn ApprovalEngine>) -> Self {
        ApprovalPolicy {
            rules,
            engine,
            grants: Mutex::new(HashMap::new()),
            deadline: None,
        }
    }

    /// As this policy, with durable requests expiring `deadline` after they are recorded.
    pub fn with_deadline(mut self, deadline: Option<std::time::Duration>) -> Self {
        self.deadline = deadline;
        self
    }

    /// How long a durable request waits before it expires; none: until decided.
    pub fn deadline(&self) -> Option<std::time::Duration> {
        self.deadline
    }

    /// Decides `request`; `None` when it needs no decision (a T0 or T1 tool no rule names).
    /// May block while the engine asks a person. An engine's
    /// [`ApprovalDecision::Deferred`] is returned as is (the caller records the request).
    pub fn decide(&self, request: &ApprovalRequest, context: &ApprovalContext) -> Option<Decided> {
        match self.settle(request, context) {
            Settled::NotNeeded => None,
            Settled::Decided(d) => Some(d),
            Settled::Ask { .. } => Some(self.ask(request, context)),
        }
    }

    /// What the rules and the session's earlier answers say of `request`, without asking the
    /// engine (steps 1, 2 and 4 of the order above).
    pub fn settle(&self, request: &ApprovalRequest, context: &ApprovalContext) -> Settled {
        let strictest = self
            .rules
            .iter()
            .filter(|r| r.matches(request))
            .max_by_key(|r| r.action);
        let described = || strictest.map(|r| r.describe()).unwrap_or_default();
        let by_rule = |decision| {
            Settled::Decided(Decided {
                decision,
                decided_by: format!("rule: {}", described()),
                wait_ms: 0,
            })
        };
        let asked_by = match strictest.map(|r| r.action) {
            Some(RuleAction::Forbid) => {
                return by_rule(ApprovalDecision::denied(format!(
                    "{} is forbidden by the policy rule {}",
                    request.tool_name,
                    described()
                )))
            }
            // A person decides a request with a notice: no rule or earlier answer does.
            _ if request.notice.is_some() => {
                return Settled::Ask {
                    asked_by: format!("notice: {}", request.notice.as_deref().unwrap_or("")),
                }
            }
            Some(RuleAction::Allow) => return by_rule(ApprovalDecision::Approved),
            Some(RuleAction::Ask) => format!("rule: {}", described()),
            None if !request.tier.needs_approval() => return Settled::NotNeeded,
            None => format!("tier {}", request.tier),
        };
        if self.granted(request, context) {
            return Settled::Decided(Decided {
                decision: ApprovalDecision::Approved,
                decided_by: "session".into(),
                wait_ms: 0,
            });
        }
        Settled::Ask { asked_by }
    }

    /// Asks the engine (step 3); an answer [`ApprovalDecision::ApprovedForSession`] is
    /// remembered. May block while the engine asks a person.
    pub fn ask(&self, request: &ApprovalRequest, context: &ApprovalContext) -> Decided {
        let started = Instant::now();
        let decision = self.engine.evaluate(request, context);
        let wait_ms = started.elapsed().as_millis() as u64;
        if decision == ApprovalDecision::ApprovedForSession {
            self.remember(request, context);
        }
        Decided {
            decision,
            decided_by: self.engine.name(),
            wait_ms,
        }
    }

    /// Remembers `request` as approved for the rest of its session (a durable decision
    /// `approved_for_session` found in the log).
    pub fn remember(&self, request: &ApprovalRequest, context: &ApprovalContext) {
        self.grants
            .lock()
            .entry(context.session_id.to_string())
            .or_default()
            .push(Grant {
                tool: request.tool_name.clone(),
                argv_prefix: request.argv.clone(),
            });
    }

    /// Whether the engine may defer (see [`ApprovalEngine::defers`]).
    pub fn engine_defers(&self) -> bool {
        self.engine.defers()
    }

    fn granted(&self, request: &ApprovalRequest, context: &ApprovalContext) -> bool {
        let grants = self.grants.lock();
        grants.get(context.session_id.as_str()).is_some_and(|gs| {
            gs.iter().any(|g| {
                g.tool == request.tool_name
                    && match (&g.argv_prefix, &request.argv) {
                        (None, _) => true,
                        (Some(p), Some(argv)) => argv.starts_with(p),
                        (Some(_), None) => false,
                    }
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approvals::{AutoApprove, CallbackApprover, DenyAll};
    use crate::ids::SessionId;
    use crate::tools::{Tier, ToolRequest};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn shell(argv: &[&str], session: &str) -> (ApprovalRequest, ApprovalContext) {
        let argv: Vec<String> = argv.iter().map(|s| (*s).to_owned()).collect();
        let mut params = serde_json::Map::new();
        params.insert("argv".into(), serde_json::json!(argv));
        let request = ToolRequest::new(SessionId::from(session), "shell", params);
        (
            ApprovalRequest::new(&request, Tier::T2, Vec::new()),
            ApprovalContext::new(SessionId::from(session)),
        )
    }

    fn rule(tool: &str, prefix: &[&str], action: RuleAction) -> ApprovalRule {
        ApprovalRule {
            tool: tool.into(),
            argv_prefix: Some(prefix.iter().map(|s| (*s).to_owned()).collect()),
            action,
        }
    }

    #[test]
    fn rules_allow_ask_and_forbid_as_written_and_the_strictest_wins() {
        let asked = Arc::new(AtomicUsize::new(0));
        let counter = asked.clone();
        let engine = Arc::new(CallbackApprover::new(move |_, _| {
            counter.fetch_add(1, Ordering::Relaxed);
            Ok(true)
        }));
        let policy = ApprovalPolicy::new(
            vec![
                rule("shell", &["git", "status"], RuleAction::Allow),
                rule("shell", &["git", "push"], RuleAction::Ask),
                rule("shell", &["rm"], RuleAction::Forbid),
                rule("shell", &["git"], RuleAction::Allow),
                rule("shell", &["git", "push", "--force"], RuleAction::Forbid),
            ],
            engine,
        );
        let decide = |argv: &[&str]| {
            let (r, c) = shell(argv, "s");
            policy.decide(&r, &c).expect("a decision")
        };
        let status = decide(&["git", "status", "-s"]);
        assert!(status.decision.is_approved());
        assert!(
            status.decided_by.starts_with("rule: shell"),
            "{}",
            status.decided_by
        );
        assert_eq!(asked.load(Ordering::Relaxed), 0);
        let push = decide(&["git", "push", "origin"]);
        assert!(push.decision.is_approved());
        assert_eq!(push.decided_by, "host");
        assert_eq!(asked.load(Ordering::Relaxed), 1);
        let rm = decide(&["rm", "-rf", "/"]);
        assert!(!rm.decision.is_approved());
        assert!(
            rm.decided_by.contains("[\"rm\"] forbid"),
            "{}",
            rm.decided_by
        );
        assert!(!decide(&["git", "push", "--force"]).decision.is_approved());
        // A prefix is whole words: "rmdir" is not "rm".
        assert_eq!(decide(&["rmdir", "x"]).decided_by, "host");
        assert_eq!(asked.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_session_answer_covers_its_session_tool_and_argv_prefix_only() {
        let asked = Arc::new(AtomicUsize::new(0));
        let counter = asked.clone();
        let engine = Arc::new(crate::approvals::CallbackApprover::with_answer(
            move |_, _| {
                counter.fetch_add(1, Ordering::Relaxed);
                Ok(ApprovalDecision::ApprovedForSession)
            },
        ));
        let policy = ApprovalPolicy::new(Vec::new(), engine);
        let (r, c) = shell(&["cargo", "test"], "s1");
        assert_eq!(
            policy.decide(&r, &c).map(|d| d.decided_by),
            Some("host".into())
        );
        // The same prefix in the same session: no question.
        let (r, c) = shell(&["cargo", "test", "--release"], "s1");
        assert_eq!(
            policy.decide(&r, &c).map(|d| d.decided_by),
            Some("session".into())
        );
        assert_eq!(asked.load(Ordering::Relaxed), 1);
        // Another argv, another session, another tool: asked again.
        let (r, c) = shell(&["cargo", "publish"], "s1");
        assert_eq!(
            policy.decide(&r, &c).map(|d| d.decided_by),
            Some("host".into())
        );
        let (r, c) = shell(&["cargo", "test"], "s2");
        assert_eq!(
            policy.decide(&r, &c).map(|d| d.decided_by),
            Some("host".into())
        );
        let write = ToolRequest::new(SessionId::from("s1"), "file_write", Default::default());
        let r = ApprovalRequest::new(&write, Tier::T2, Vec::new());
        let c = ApprovalContext::new(SessionId::from("s1"));
        assert_eq!(
            policy.decide(&r, &c).map(|d| d.decided_by),
            Some("host".into())
        );
        assert_eq!(asked.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn low_tiers_need_no_decision_unless_a_rule_names_them_and_engines_say_who_they_are() {
        let read = ToolRequest::new(SessionId::from("s"), "file_read", Default::default());
        let r = ApprovalRequest::new(&read, Tier::T1, Vec::new());
        let c = ApprovalContext::new(SessionId::from("s"));
        let open = ApprovalPolicy::new(Vec::new(), Arc::new(DenyAll));
        assert_eq!(open.decide(&r, &c), None);
        let asking = ApprovalPolicy::new(
            vec![ApprovalRule {
                tool: "file_read".into(),
                argv_prefix: None,
                action: RuleAction::Ask,
            }],
            Arc::new(DenyAll),
        );
        let d = asking.decide(&r, &c).expect("asked");
        assert!(!d.decision.is_approved());
        assert_eq!(d.decided_by, "deny_all");
        let auto = ApprovalPolicy::new(Vec::new(), Arc::new(AutoApprove::up_to(Tier::T2)));
        let (r, c) = shell(&["ls"], "s");
        assert_eq!(
            auto.decide(&r, &c).map(|d| d.decided_by),
            Some("auto up to T2".into())
        );
    }
}
