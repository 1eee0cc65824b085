//! What the shell needs of the runtime's background jobs: a place for a job, then the job
//! made of a started program. The job table implements it; the shell does not know it.

use crate::sys::spawn::{Cleanup, Started};
use std::time::Duration;

/// What a job is, besides its running program.
pub(crate) struct Launch {
    pub invocation_id: String,
    pub command: Vec<String>,
    pub timeout: Duration,
    /// Bytes kept of each stream.
    pub buffer_bytes: usize,
    /// Runs once every process of the job is gone, before its end is recorded (the run's
    /// temp directory, cgroup and proxy go).
    pub cleanup: Cleanup,
}

/// Where a shell request with `"background": true` goes.
pub(crate) trait Background: Send + Sync {
    /// A place for a job of `session`, which may have at most `max` running or starting; held
    /// until it is launched or dropped, so racing starts respect the bound.
    ///
    /// # Errors
    /// Why there is no place (the session's jobs fill it, the runtime is closing), for the
    /// model to read.
    fn reserve(&self, session: &str, max: usize) -> Result<Box<dyn Reserved + '_>, String>;
}

/// A place taken for one job.
pub(crate) trait Reserved {
    /// Makes `started` a job (recorded, its output read until it ends); its id.
    ///
    /// # Errors
    /// Why it could not be recorded: the program is killed and its cleanup run.
    fn launch(self: Box<Self>, started: Started, launch: Launch) -> Result<String, String>;
}
