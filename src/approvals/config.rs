//! [`ApprovalsConfig`]: how approvals are decided (config `approvals`).

use super::ApprovalRule;
use crate::settings::{self, ConfigError, Section};
use crate::tools::Tier;
use serde::{Deserialize, Deserializer};

/// Which engine decides approvals the rules leave open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineChoice {
    /// The host's engine (in C, the callback set with `correx_runtime_set_approver`).
    #[default]
    Callback,
    /// Approve tiers up to `max_tier`, deny the rest.
    Auto,
    /// Deny everything that needs approval.
    Deny,
    /// Record every request the rules leave open (`tool.approval_requested`) for a decision
    /// from any process, later ([`super::Approvals::decide`], `correx approvals decide`).
    Durable,
}

/// How approvals are decided (config `approvals`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApprovalsConfig {
    /// The engine; default the host's callback.
    pub engine: EngineChoice,
    /// For `auto`: the highest tier approved, a number 0-3; default 2.
    #[serde(deserialize_with = "tier_number")]
    pub max_tier: Tier,
    /// Rules checked before the engine.
    pub rules: Vec<ApprovalRule>,
    /// A durable request not decided within this many seconds is `expired` (denied); none:
    /// it waits until decided.
    pub deadline_secs: Option<u64>,
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        ApprovalsConfig {
            engine: EngineChoice::Callback,
            max_tier: Tier::T2,
            rules: Vec::new(),
            deadline_secs: None,
        }
    }
}

impl Section for ApprovalsConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        settings::check(
            self.deadline_secs.is_none_or(|d| d > 0),
            "deadline_secs",
            "must be above 0; leave it out for requests that wait until decided",
        )?;
        for (i, rule) in self.rules.iter().enumerate() {
            let at = |e: ConfigError| e.under(&format!("rules[{i}]"));
            settings::check(
                !rule.tool.is_empty(),
                "tool",
                "must not be empty; name the tool the rule is about",
            )
            .map_err(at)?;
            settings::check(
                rule.argv_prefix.as_ref().is_none_or(|p| !p.is_empty()),
                "argv_prefix",
                "must not be empty; leave it out to match every request",
            )
            .map_err(at)?;
        }
        Ok(())
    }
}

/// A tier as its number; 4 and above are refused rather than read as T3.
fn tier_number<'de, D: Deserializer<'de>>(d: D) -> Result<Tier, D::Error> {
    match u64::deserialize(d)? {
        n @ 0..=3 => Ok(Tier::from_i32(n as i32)),
        n => Err(serde::de::Error::custom(format!("{n} is not a tier (0-3)"))),
    }
}
