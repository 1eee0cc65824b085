//! Running a helper program (such as `patch`) unconfined but fenced and contained: a cleared
//! environment, stdin from `/dev/null`, capped output, a timeout, and nothing it starts left
//! behind when the run returns. The shell tool uses [`crate::sys::spawn`] directly, with its
//! confinement.

use crate::sys::spawn::{self, SpawnSpec};
use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

pub(crate) use crate::sys::spawn::{Exit, RunOutput};
pub(crate) use crate::sys::{resolve_executable, FIXED_PATH};

/// What to run.
pub(crate) struct RunSpec<'a> {
    pub program: &'a Path,
    /// What the child sees as `argv[0]`; default the program path.
    pub arg0: Option<&'a str>,
    pub args: &'a [String],
    /// Variables besides `PATH`.
    pub env: &'a [(String, String)],
    pub cwd: Option<&'a Path>,
    pub timeout: Duration,
    /// Most bytes kept of stdout, and separately of stderr; the rest is read and dropped.
    pub output_cap: usize,
}

/// Runs `spec` to completion (or timeout) and returns its output.
///
/// # Errors
/// The spawn's `io::Error` (binary missing, not executable, bad working directory).
pub(crate) fn run(spec: &RunSpec<'_>) -> io::Result<RunOutput> {
    let cwd = spec.cwd.map(crate::sys::open_dir).transpose()?;
    let arg0: &OsStr = spec.arg0.map_or(spec.program.as_os_str(), OsStr::new);
    let argv: Vec<&OsStr> = std::iter::once(arg0)
        .chain(spec.args.iter().map(OsStr::new))
        .collect();
    let mut env = vec![("PATH".to_owned(), FIXED_PATH.to_owned())];
    env.extend(spec.env.iter().cloned());
    spawn::run(&SpawnSpec {
        cwd_path: None,
        program: spec.program,
        argv: &argv,
        env: &env,
        cwd: cwd.as_ref().map(|f| f.as_raw_fd()),
        confinement: None,
        containment: spawn::best_containment(),
        cgroup: None,
        spawner: None,
        timeout: spec.timeout,
        output_cap: spec.output_cap,
        cancel: None,
        net: None,
        stdin: false,
    })
}
