//! [`JobsOptions`]: how the shell's background jobs are bounded (config `tools.shell.jobs`).

use crate::settings::{self, ConfigError, Section};
use serde::Deserialize;
use std::time::Duration;

/// Bounds on a shell's background jobs (config `tools.shell.jobs`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JobsOptions {
    /// Jobs one session may have running at once; default 4. 0 turns background runs off.
    pub max_per_session: usize,
    /// A job's wall-clock limit when its request sets none, and the most one may set; default
    /// one hour, at most the shell's `MAX_TIMEOUT` (config `timeout_ms`).
    #[serde(rename = "timeout_ms", with = "settings::millis")]
    pub timeout: Duration,
    /// Bytes kept of each of a job's streams (older bytes are dropped and counted); default
    /// 1 MiB.
    pub buffer_bytes: usize,
}

impl Default for JobsOptions {
    fn default() -> Self {
        JobsOptions {
            max_per_session: 4,
            timeout: Duration::from_secs(3600),
            buffer_bytes: 1024 * 1024,
        }
    }
}

impl Section for JobsOptions {
    fn validate(&self) -> Result<(), ConfigError> {
        settings::positive_ms("timeout_ms", self.timeout)?;
        settings::check(
            self.timeout <= crate::tools::MAX_TIMEOUT,
            "timeout_ms",
            format!(
                "must be at most {} (7 days)",
                crate::tools::MAX_TIMEOUT.as_millis()
            ),
        )?;
        settings::positive("buffer_bytes", self.buffer_bytes as u64)
    }
}
