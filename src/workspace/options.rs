//! [`WorkspaceMode`] and [`StagingOptions`]: how a shell's runs change their working dirs
//! (config `tools.shell.workspace` and `tools.shell.staging`).

use crate::settings::{self, ConfigError, Section};
use serde::Deserialize;

/// Whether a run changes its working dirs in place or in a staged layer (config
/// `tools.shell.workspace`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceMode {
    /// The run writes the real tree (default).
    #[default]
    Direct,
    /// Each working dir is an overlay in the run's view: the real tree does not change while
    /// it runs, and what it changed is a change set to promote or discard.
    Staged,
}

/// When a staged run's change set is applied to the real tree (config
/// `tools.shell.staging.promote`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromotePolicy {
    /// Promoted when the run succeeds (exit 0), discarded otherwise (default).
    #[default]
    OnSuccess,
    /// Kept until the host promotes or discards it, whatever the run's outcome.
    Manual,
}

impl PromotePolicy {
    /// The policy's config name.
    pub fn as_str(self) -> &'static str {
        match self {
            PromotePolicy::OnSuccess => "on_success",
            PromotePolicy::Manual => "manual",
        }
    }
}

/// Bounds and policy of staged runs (config `tools.shell.staging`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StagingOptions {
    /// When a change set is applied; default [`PromotePolicy::OnSuccess`].
    pub promote: PromotePolicy,
    /// The most bytes one run's change set may hold (files it wrote, counted when it ends);
    /// a larger one is discarded and the run fails. Default 1 GiB.
    pub max_run_bytes: u64,
    /// The most bytes the change sets kept for the host (`manual`) may hold together; a run
    /// whose change set would pass it is discarded and fails. Default 4 GiB.
    pub max_kept_bytes: u64,
    /// The most bytes one session's promoted change sets may keep for rewinding it (what
    /// each promotion replaced and removed); past it the oldest are dropped, and the session
    /// can no longer be rewound to before them. 0 keeps none. Default 1 GiB.
    pub max_rewind_bytes: u64,
}

impl Default for StagingOptions {
    fn default() -> Self {
        StagingOptions {
            promote: PromotePolicy::OnSuccess,
            max_run_bytes: 1 << 30,
            max_kept_bytes: 4 << 30,
            max_rewind_bytes: 1 << 30,
        }
    }
}

impl Section for StagingOptions {
    fn validate(&self) -> Result<(), ConfigError> {
        settings::positive("max_run_bytes", self.max_run_bytes)?;
        settings::positive("max_kept_bytes", self.max_kept_bytes)
    }
}
