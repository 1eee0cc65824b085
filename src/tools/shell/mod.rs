//! [`ShellTool`]: runs one executable from an allowlist, by argv, never through a shell.

use super::fs::{Located, Roots};
use super::params::{json_kind, optional_str};
use super::{
    Tool, ToolCapability, ToolError, ToolErrorKind, ToolRequest, ToolResult, ValidationResult,
};
use crate::cancel::CancelToken;
use crate::confine::net::{self as network, RunProxy};
use crate::confine::{self, AppliedPolicy, Policy, Route, RunNetwork};
use crate::private_dir::{check_private, PrivateDir};
use crate::settings::Section;
use crate::sys::spawn::{self, Captured, Cleanup, Exit, RunNet, RunOutput, SpawnSpec, Started};
use crate::sys::{resolve_both, FIXED_PATH};
use crate::tools::Recoverable;
use crate::workspace::{RunLayer, Settled, Staging, WorkspaceMode};
use background::{Background, Launch};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub(crate) mod background;
mod jobs;
mod options;

pub use jobs::JobsOptions;
pub use options::{ShellOptions, DEFAULT_OUTPUT_CAP, MAX_TIMEOUT};

/// Runs an allowlisted executable with argv from the request (`{"argv": ["ls", "-l"]}`, and an
/// optional `"cwd"` inside a working root). Tier T2.
///
/// The child gets a cleared environment (a fixed `PATH`, `TMPDIR` and configured variables),
/// stdin from `/dev/null`, and a private temp directory removed after the run. It starts in the
/// request's `cwd`, else the first working root, else its temp directory. It is confined by the
/// kernel as [`IsolationOptions`](crate::IsolationOptions) say (Landlock: read and execute
/// only the system directories, the allowed executables' directories and `read_paths`; write
/// only the working roots and its temp directory; seccomp: no socket but `AF_UNIX`, or TCP to
/// its proxy alone with a network allowlist; resource limits), and contained: when the run
/// ends, by exit or timeout, every process it started is killed, however it detached.
///
/// Exit 0 is a success with stdout as the output; non-zero is a failure with stderr as the
/// reason. Metadata: `exit_code` or `signal`, `stdout_truncated`, `stderr_truncated`,
/// `duration_ms`.
pub struct ShellTool {
    allowed: Vec<Allowed>,
    env: Vec<(String, String)>,
    timeout: Duration,
    output_cap: usize,
    roots: Roots,
    /// The same roots as a run sees them, where that differs (idmapped on a root host).
    run_roots: Option<Roots>,
    working_roots: Vec<PathBuf>,
    /// The policy the kernel can enforce, or why `required` cannot be met here (every run is
    /// then refused with that reason).
    policy: Result<Policy, Refusal>,
    tmp_base: PathBuf,
    /// An empty private temp directory a finished run left, for the next run: making and
    /// removing a directory costs about 100 µs of journaled metadata on ext4, more than the
    /// rest of a spawn's overhead.
    spare: parking_lot::Mutex<Option<PathBuf>>,
    /// The runtime's job table and this shell's bounds on it; `None`: background runs are
    /// refused.
    jobs: Option<(Arc<dyn Background>, JobsOptions)>,
    jobs_options: JobsOptions,
    /// Staged runs' layers (`workspace: "staged"`), or why runs cannot be staged here (each
    /// is then refused with it); `None`: runs change their working dirs in place.
    staging: Option<Result<Staging, String>>,
}

/// A staged run's layer until the run's end settles it; dropped unsettled (the run never
/// started), it goes.
struct Layer(Option<RunLayer>);

impl Drop for Layer {
    fn drop(&mut self) {
        if let Some(l) = self.0.take() {
            l.remove();
        }
    }
}

/// A run about to start: what [`ShellTool::prepare`] made for it. Dropped, everything goes.
struct Prepared<'a> {
    id: crate::ids::ToolInvocationId,
    argv: Vec<String>,
    policy: &'a Policy,
    program: PathBuf,
    arg0: String,
    tmp: PrivateDir,
    cwd: OwnedFd,
    /// The start directory by path, for a run that builds its own view.
    cwd_path: Option<PathBuf>,
    confinement: Option<crate::sys::spawn::Confinement>,
    cgroup: Option<crate::sys::cgroup::RunCgroup>,
    env: Vec<(String, String)>,
    proxy: Option<RunProxy>,
    net_end: NetEnd,
    layer: Layer,
}

/// The run's end of its way to the network (the socket its supervisor gets, and how it is
/// used), where it has one.
type NetEnd = Option<(Option<OwnedFd>, RunNet)>;

impl Prepared<'_> {
    /// The run's argv: the allowed name as `argv[0]`, then the request's arguments.
    fn argv_os(&self) -> Vec<&OsStr> {
        std::iter::once(OsStr::new(&self.arg0))
            .chain(self.argv[1..].iter().map(OsStr::new))
            .collect()
    }

    /// The spawn of this run: its program, environment, start directory, confinement, cgroup
    /// and network end, with `argv` from [`Prepared::argv_os`].
    fn spec<'s>(
        &'s self,
        argv: &'s [&'s OsStr],
        timeout: Duration,
        output_cap: usize,
        cancel: Option<&'s CancelToken>,
        stdin: bool,
    ) -> SpawnSpec<'s> {
        SpawnSpec {
            program: &self.program,
            argv,
            env: &self.env,
            cwd: Some(self.cwd.as_raw_fd()),
            cwd_path: self.cwd_path.as_deref(),
            confinement: self.confinement.as_ref(),
            containment: self.policy.containment,
            cgroup: self.cgroup.as_ref().map(|c| c.procs()),
            spawner: self.policy.spawner(),
            timeout,
            output_cap,
            cancel,
            net: self.net_end.as_ref().map(|(_, net)| *net),
            stdin,
        }
    }

    /// Starts the program, to run on after this returns (a background job, a server);
    /// `None` from the spawn (no exec within the timeout) is a `timed_out` failure. The
    /// cleanup drops what the run held once it has ended.
    fn start(self, timeout: Duration, stdin: bool) -> Result<(Started, Cleanup), ToolResult> {
        let argv = self.argv_os();
        let started = spawn::start(&self.spec(&argv, timeout, 0, None, stdin));
        let id = self.id.clone();
        let started = started.map_err(|e| {
            ToolResult::failure(
                &id,
                format!("could not start {}: {e}", self.program.display()),
                Recoverable::No,
            )
        })?;
        let Some(started) = started else {
            let what = format!("did not start within {} ms", timeout.as_millis());
            return Err(ToolResult::failure_of(
                &id,
                ToolErrorKind::TimedOut,
                what,
                Recoverable::Yes,
            ));
        };
        let Prepared {
            tmp,
            cwd,
            cgroup,
            proxy,
            net_end,
            ..
        } = self;
        let cleanup = move || {
            drop(net_end);
            if let Some(p) = proxy {
                p.stop();
            }
            drop((cwd, cgroup, tmp));
        };
        Ok((started, Box::new(cleanup)))
    }
}

/// A background request's job table, and this shell's bounds on it.
type BackgroundRun<'a> = (&'a dyn Background, &'a JobsOptions);

/// A shell request as read, once, for its validation and its run alike.
struct ShellRequest<'a> {
    argv: Vec<&'a str>,
    /// A background job's table and this shell's bounds on it; `None` for a run that ends
    /// with its call.
    background: Option<(&'a dyn Background, &'a JobsOptions)>,
    timeout: Duration,
}

/// Why a request cannot run: its kind, the reason, and whether a changed request may.
type Unfit = (ToolErrorKind, String, Recoverable);

/// Why the `required` policy cannot be met on this kernel.
#[derive(Debug)]
struct Refusal {
    reason: String,
    applied: AppliedPolicy,
}

impl Drop for ShellTool {
    fn drop(&mut self) {
        if let Some(p) = self.spare.get_mut().take() {
            crate::private_dir::remove_tree(&p);
        }
    }
}

impl std::fmt::Debug for ShellTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShellTool")
            .field("allowed", &self.allowed)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// One allowed executable: its canonical path, and the name it was allowed under. Multi-call
/// binaries (busybox, bash as rbash) act on `argv[0]`, so a request must match both: the same
/// file, reached under the same name.
#[derive(Debug)]
struct Allowed {
    canonical: PathBuf,
    name: std::ffi::OsString,
    pin: Pin,
}

/// What an allowed executable was when the tool was built; a run of a file that no longer
/// matches (replaced, rewritten) is refused.
#[derive(Debug, PartialEq, Eq)]
struct Pin {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

impl Pin {
    fn of(path: &Path) -> Option<Pin> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(Pin {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
        })
    }
}

fn file_name(p: &std::path::Path) -> std::ffi::OsString {
    p.file_name().map(|n| n.to_os_string()).unwrap_or_default()
}

/// Whether a variable looks like it carries a secret: its name holds KEY, SECRET, TOKEN,
/// PASSWORD, PASSWD, CREDENTIAL, COOKIE or PRIVATE, ends in `_PAT`, or is `DATABASE_URL`.
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    [
        "KEY",
        "SECRET",
        "TOKEN",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "COOKIE",
        "PRIVATE",
    ]
    .iter()
    .any(|w| upper.contains(w))
        || upper.ends_with("_PAT")
        || upper == "DATABASE_URL"
}

/// Whether a value holds credentials in a URL (`scheme://user:password@host`).
fn holds_url_credentials(value: &str) -> bool {
    value.split("://").skip(1).any(|rest| {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        authority
            .rsplit_once('@')
            .is_some_and(|(userinfo, _)| userinfo.contains(':'))
    })
}

/// Each allowed executable resolved once, through the fixed PATH, to a canonical path and
/// the name it is allowed under, pinned as it is now.
fn allow(names: &[String]) -> Result<Vec<Allowed>, ToolError> {
    let mut allowed = Vec::new();
    for name in names {
        let not_found = || ToolError::ExecutableNotFound {
            name: name.clone(),
            path: FIXED_PATH,
        };
        let (lexical, canonical) = resolve_both(name).ok_or_else(not_found)?;
        let pin = Pin::of(&canonical).ok_or_else(not_found)?;
        allowed.push(Allowed {
            canonical,
            name: file_name(&lexical),
            pin,
        });
    }
    Ok(allowed)
}

/// Shell start-up variables; with every `LD_*` (the dynamic loader's), they make a program the
/// allowlist admits run other code first.
const SHELL_START_VARS: &[&str] = &["BASH_ENV", "ENV"];

fn check_env(options: &ShellOptions) -> Result<(), ToolError> {
    for (name, value) in &options.env {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(ToolError::InvalidSetting {
                field: "env",
                reason: format!("{name:?} is not a valid variable name"),
            });
        }
        if value.contains('\0') {
            return Err(ToolError::InvalidSetting {
                field: "env",
                reason: format!("the value of {name} holds a NUL byte"),
            });
        }
        if name == "PATH" || name == "TMPDIR" {
            return Err(ToolError::InvalidSetting {
                field: "env",
                reason: format!(
                    "{name} is set by the shell tool (PATH={FIXED_PATH}; TMPDIR is the run's private temp directory)"
                ),
            });
        }
        let forced = options.force_secret_env;
        if (looks_secret(name) || holds_url_credentials(value)) && !forced {
            return Err(ToolError::SecretEnvVar { name: name.clone() });
        }
        if (name.starts_with("LD_") || SHELL_START_VARS.contains(&name.as_str())) && !forced {
            return Err(ToolError::InvalidSetting {
                field: "env",
                reason: format!(
                    "{name} changes which code the loader or a shell runs first; set force_secret_env to pass it anyway"
                ),
            });
        }
    }
    Ok(())
}

/// The per-user directory the runs' private temp directories live in.
fn tmp_base() -> PathBuf {
    std::env::temp_dir().join(format!("correx-shell-{}", crate::sys::euid()))
}

/// Creates the temp base (mode 0700) if missing, and checks it is private.
fn make_tmp_base(base: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(base) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    check_private(base)
}

/// The staging of a tool with `workspace: "staged"`, or why its runs cannot be staged here.
fn open_staging(
    policy: &Result<Policy, Refusal>,
    tmp_base: &Path,
    working_roots: &[PathBuf],
    options: &crate::workspace::StagingOptions,
) -> Result<Staging, String> {
    let policy = policy.as_ref().map_err(|r| r.reason.clone())?;
    let userxattr = policy.staging()?;
    if let Some(r) = working_roots.iter().find(|r| tmp_base.starts_with(r)) {
        return Err(format!(
            "the runs' temp base {} lies in working dir {}, which its layers would stage too",
            tmp_base.display(),
            r.display()
        ));
    }
    Staging::open(
        &tmp_base.join("stage"),
        working_roots,
        policy.run_ids(),
        (userxattr, policy.stage_rights),
        options.clone(),
    )
    .map_err(|e| format!("opening the staging directory: {e}"))
}

impl ShellTool {
    /// Resolves every allowed executable once, through the fixed PATH, to a canonical path.
    ///
    /// # Errors
    /// [`ToolError::Config`] for settings a config section would refuse (a zero timeout or
    /// cap, a relative working dir, bad isolation settings),
    /// [`ToolError::ExecutableNotFound`], [`ToolError::SecretEnvVar`], [`ToolError::Root`],
    /// [`ToolError::InvalidSetting`] for a bad environment variable.
    pub fn new(options: ShellOptions) -> Result<Self, ToolError> {
        // The config's own checks, with its messages: a shell built from Rust is held to what
        // a config section is.
        options.validate().map_err(ToolError::Config)?;
        let allowed = allow(&options.allowed_executables)?;
        check_env(&options)?;
        let roots = Roots::open(&options.working_roots).map_err(ToolError::Root)?;
        let mut exec_dirs: Vec<PathBuf> = Vec::new();
        for d in allowed.iter().filter_map(|a| a.canonical.parent()) {
            if !exec_dirs.iter().any(|e| e == d) {
                exec_dirs.push(d.to_path_buf());
            }
        }
        let working_roots: Vec<PathBuf> = options
            .working_roots
            .iter()
            .map(|r| std::fs::canonicalize(r).unwrap_or_else(|_| r.clone()))
            .collect();
        let tmp_base = tmp_base();
        let confined = options.isolation.mode != confine::IsolationMode::None;
        // A confined run's view holds the temp base (on a root host through an idmapped mount
        // made now): it must exist, under its real path.
        let tmp_base = if confined {
            make_tmp_base(&tmp_base)
                .and_then(|()| std::fs::canonicalize(&tmp_base))
                .map_err(|e| ToolError::InvalidSetting {
                    field: "isolation",
                    reason: format!("creating {}: {e}", tmp_base.display()),
                })?
        } else {
            tmp_base
        };
        // A staged tool's layers are in the view too, as they are on disk.
        let stage_base = tmp_base.join("stage");
        let staging_dir = match options.workspace {
            WorkspaceMode::Staged if confined => {
                crate::workspace::make_base(&stage_base).map_err(|e| {
                    ToolError::InvalidSetting {
                        field: "workspace",
                        reason: format!("creating {}: {e}", stage_base.display()),
                    }
                })?;
                Some(stage_base.as_path())
            }
            _ => None,
        };
        let policy = confine::plan(
            &options.isolation,
            &working_roots,
            &exec_dirs,
            &tmp_base,
            staging_dir,
        )
        .map_err(|reason| {
            log::warn!("shell tool: every run will be refused: {reason}");
            Refusal {
                applied: AppliedPolicy::Refused {
                    mode: options.isolation.mode,
                    refused: reason.clone(),
                },
                reason,
            }
        });
        // The working roots as the run sees them (idmapped, on a root host), in the same order.
        let run_roots = match policy.as_ref().ok().and_then(|p| p.held.as_ref()) {
            // Idmapped (every working root has its view), or not at all.
            Some(held) if working_roots.iter().all(|r| held.view(r).is_some()) => {
                let mut fds = Vec::with_capacity(working_roots.len());
                for view in working_roots.iter().filter_map(|r| held.view(r)) {
                    fds.push(view.try_clone().map_err(|e| ToolError::InvalidSetting {
                        field: "working_dirs",
                        reason: e.to_string(),
                    })?);
                }
                Some(roots.with_fds(fds))
            }
            _ => None,
        };
        let staging = match options.workspace {
            WorkspaceMode::Direct => None,
            WorkspaceMode::Staged => Some(open_staging(
                &policy,
                &tmp_base,
                &working_roots,
                &options.staging,
            )),
        };
        if let Some(Err(why)) = &staging {
            log::warn!("shell tool: every staged run will be refused: {why}");
        }
        Ok(ShellTool {
            allowed,
            env: options.env.into_iter().collect(),
            timeout: options.timeout,
            output_cap: options.output_cap,
            roots,
            run_roots,
            working_roots,
            policy,
            tmp_base,
            spare: parking_lot::Mutex::new(None),
            jobs: None,
            jobs_options: options.jobs,
            staging,
        })
    }

    /// The same tool, starting background jobs (`"background": true`) in `table`.
    pub(crate) fn with_jobs(mut self, table: Arc<dyn Background>) -> Self {
        self.jobs = Some((table, self.jobs_options.clone()));
        self
    }

    /// A background request's job table and bounds; `None` for a run that ends with its call.
    fn background(
        &self,
        request: &ToolRequest,
    ) -> Result<Option<BackgroundRun<'_>>, (ToolErrorKind, String)> {
        let off = |reason: &str| (ToolErrorKind::NotAllowed, reason.to_owned());
        let invalid = |reason: String| (ToolErrorKind::InvalidRequest, reason);
        match request.parameters.get("background") {
            None | Some(serde_json::Value::Null | serde_json::Value::Bool(false)) => Ok(None),
            Some(serde_json::Value::Bool(true)) => {
                let Some((table, options)) = &self.jobs else {
                    return Err(off(
                        "background runs need a runtime's job table (a shell built by Runtime::new)",
                    ));
                };
                if options.max_per_session == 0 {
                    return Err(off(
                        "background runs are off (tools.shell.jobs.max_per_session is 0)",
                    ));
                }
                Ok(Some((table.as_ref(), options)))
            }
            Some(v) => Err(invalid(format!(
                "parameter \"background\" must be true or false, got {}",
                json_kind(v)
            ))),
        }
    }

    /// Test hook (feature `test-hooks`): builds one run's confinement (Landlock ruleset and
    /// seccomp filter) and drops it: what a run spends on it, for the `tools` benchmark.
    #[cfg(feature = "test-hooks")]
    pub fn build_confinement_for_bench(&self) -> Result<(), String> {
        let policy = self.policy.as_ref().map_err(|r| r.reason.clone())?;
        policy.confinement(&self.tmp_base).map(drop)
    }

    /// The canonical paths of the allowed executables.
    pub fn allowed_paths(&self) -> Vec<PathBuf> {
        self.allowed.iter().map(|a| a.canonical.clone()).collect()
    }

    /// The confinement actually applied to every run, as recorded in `tool.execution_started`;
    /// where `required` cannot be met on this kernel, `{"mode": "required", "refused": why}`.
    pub fn applied_policy(&self) -> &AppliedPolicy {
        match &self.policy {
            Ok(p) => &p.applied,
            Err(r) => &r.applied,
        }
    }

    /// Why every run is refused: the kernel cannot enforce the `required` isolation policy
    /// (the reason names the missing feature and what to set instead). `None` when runs go
    /// ahead.
    pub fn refusal(&self) -> Option<&str> {
        self.policy.as_ref().err().map(|r| r.reason.as_str())
    }

    fn argv<'a>(&self, request: &'a ToolRequest) -> Result<Vec<&'a str>, String> {
        let v = request
            .parameters
            .get("argv")
            .ok_or("missing required parameter \"argv\" (an array of strings)")?;
        let arr = v.as_array().ok_or_else(|| {
            format!(
                "parameter \"argv\" must be an array of strings, got {}",
                json_kind(v)
            )
        })?;
        if arr.is_empty() {
            return Err("parameter \"argv\" is empty; its first element is the executable".into());
        }
        arr.iter()
            .enumerate()
            .map(|(i, a)| match a.as_str() {
                Some(s) if s.contains('\0') => Err(format!("argv[{i}] holds a NUL byte")),
                Some(s) => Ok(s),
                None => Err(format!("argv[{i}] must be a string, got {}", json_kind(a))),
            })
            .collect()
    }

    /// The canonical program and the `argv[0]` to run it under, if `argv0` is allowed; the
    /// allowed entry is returned too, for its pin.
    fn permitted(&self, argv0: &str) -> Option<(PathBuf, String, &Allowed)> {
        if self.allowed.is_empty() {
            return None;
        }
        let (lexical, canonical) = resolve_both(argv0)?;
        let name = file_name(&lexical);
        let allowed = self
            .allowed
            .iter()
            .find(|a| a.canonical == canonical && a.name == name)?;
        Some((canonical, name.to_string_lossy().into_owned(), allowed))
    }

    /// A directory descriptor to start in: the request's `cwd`, else the first working root,
    /// else the run's temp directory; as the run sees it (through its idmapped mounts on a
    /// root host).
    fn start_dir(&self, request: &ToolRequest, tmp: &Path) -> Result<OwnedFd, ToolResult> {
        let id = &request.invocation_id;
        let roots = self.run_roots.as_ref().unwrap_or(&self.roots);
        // A cwd is opened beneath its root and handed to the child as a descriptor, so nothing
        // can swap a symlink in between the check and the chdir.
        if let Some(cwd) = optional_str(request, "cwd")? {
            let loc: Located = roots
                .locate(cwd)
                .map_err(|e| ToolResult::failure(id, format!("cwd: {e}"), Recoverable::No))?;
            return roots
                .open_at(&loc, libc::O_PATH | libc::O_DIRECTORY, 0)
                .map_err(|e| {
                    ToolResult::failure(id, format!("cwd: {e}"), Recoverable::from(e.recoverable()))
                });
        }
        let opened = match (&self.run_roots, self.working_roots.first()) {
            (Some(run_roots), Some(_)) => run_roots.open_root(0),
            (None, Some(dir)) => crate::sys::open_dir(dir),
            (_, None) => match self
                .policy
                .as_ref()
                .ok()
                .and_then(|p| p.held.as_ref())
                .and_then(|held| held.view(&self.tmp_base))
            {
                Some(base) => {
                    crate::sys::open_dir_at(base, tmp.strip_prefix(&self.tmp_base).unwrap_or(tmp))
                }
                None => crate::sys::open_dir(tmp),
            },
        };
        opened.map_err(|e| {
            ToolResult::failure(
                id,
                format!("opening the run's start directory: {e}"),
                Recoverable::Yes,
            )
        })
    }

    /// An empty private temp directory for one run, in the per-user base (checked private):
    /// the one the last run left empty, or a new one.
    fn run_tmp(&self) -> std::io::Result<PrivateDir> {
        if let Some(p) = self.spare.lock().take() {
            if check_private(&p).is_ok() {
                return Ok(PrivateDir::adopt(p));
            }
            crate::private_dir::remove_tree(&p);
        }
        make_tmp_base(&self.tmp_base)?;
        PrivateDir::new_in(&self.tmp_base, "run-")
    }

    /// After a run: keeps its temp directory for the next run when it is empty and still
    /// private (nothing of this run reaches the next), else removes it.
    fn recycle(&self, tmp: PrivateDir) {
        let empty = std::fs::read_dir(tmp.path()).is_ok_and(|mut d| d.next().is_none());
        if empty && check_private(tmp.path()).is_ok() {
            let mut spare = self.spare.lock();
            if spare.is_none() {
                *spare = Some(tmp.keep());
            }
        }
    }

    /// The request's argv, timeout and background, each checked (in that order).
    fn read_request<'a>(&'a self, request: &'a ToolRequest) -> Result<ShellRequest<'a>, Unfit> {
        let invalid = |r: String| (ToolErrorKind::InvalidRequest, r, Recoverable::Yes);
        let argv = self.argv(request).map_err(invalid)?;
        let asked = self.timeout_of(request).map_err(invalid)?;
        let background = self
            .background(request)
            .map_err(|(kind, r)| (kind, r, Recoverable::No))?;
        // A job's bound is the jobs section's, a run's the shell's.
        let bound = background.map_or(self.timeout, |(_, options)| options.timeout);
        Ok(ShellRequest {
            argv,
            timeout: asked.map_or(bound, |t| t.min(bound)),
            background,
        })
    }

    /// The request's `timeout_ms`, checked; `None` without one (the bound applies).
    fn timeout_of(&self, request: &ToolRequest) -> Result<Option<Duration>, String> {
        match request.parameters.get("timeout_ms") {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(0) | None => Err(format!(
                    "parameter \"timeout_ms\" must be a positive integer, got {v}"
                )),
                Some(ms) => Ok(Some(Duration::from_millis(ms))),
            },
        }
    }

    /// Everything a run needs before its program starts: the checks (confinable, allowed,
    /// unchanged, its namespace's views intact), its temp directory, start directory,
    /// confinement, cgroup, environment and, with a network allowlist, its proxy.
    fn prepare(&self, request: &ToolRequest, argv: &[&str]) -> Result<Prepared<'_>, ToolResult> {
        let id = &request.invocation_id;
        let (policy, program, arg0) = self.checked(id, argv[0])?;
        let tmp = self.run_tmp().map_err(|e| {
            ToolResult::failure(
                id,
                format!("creating the run's temp directory: {e}"),
                Recoverable::Yes,
            )
        })?;
        let cwd = self.start_dir(request, tmp.path())?;
        // Each granted path is at its own path in the run's view: the directory's path here is
        // its path there.
        let cwd_path = if policy.start_by_path() {
            Some(
                std::fs::read_link(format!("/proc/self/fd/{}", cwd.as_raw_fd())).map_err(|e| {
                    ToolResult::failure(
                        id,
                        format!("naming the run's start directory: {e}"),
                        Recoverable::Yes,
                    )
                })?,
            )
        } else {
            None
        };
        let confinement = policy
            .confinement(tmp.path())
            .map_err(|e| ToolResult::failure(id, e, Recoverable::Yes))?;
        let cgroup = policy
            .run_cgroup()
            .map_err(|e| ToolResult::failure(id, e, Recoverable::Yes))?;
        let mut env = Vec::with_capacity(self.env.len() + 2);
        env.push(("PATH".to_owned(), FIXED_PATH.to_owned()));
        env.push(("TMPDIR".to_owned(), tmp.path().display().to_string()));
        let (proxy, net_end) = self.network_for(id, policy, &mut env)?;
        let mut confinement = confinement;
        let session = request.session_id.as_str();
        let layer = Layer(self.stage((session, id), confinement.as_mut())?);
        Ok(Prepared {
            id: id.clone(),
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            policy,
            program,
            arg0,
            tmp,
            cwd,
            cwd_path,
            confinement,
            cgroup,
            env,
            proxy,
            net_end,
            layer,
        })
    }

    /// A staged run's layer, its overlays set in the run's `confinement`; `None` for a run that
    /// changes its working dirs in place.
    fn stage(
        &self,
        (session, id): (&str, &crate::ids::ToolInvocationId),
        confinement: Option<&mut crate::sys::spawn::Confinement>,
    ) -> Result<Option<RunLayer>, ToolResult> {
        let staging = match &self.staging {
            None => return Ok(None),
            Some(Ok(s)) => s,
            Some(Err(why)) => {
                return Err(ToolResult::failure_of(
                    id,
                    ToolErrorKind::NotAllowed,
                    format!("the run cannot be staged here: {why}"),
                    Recoverable::No,
                ))
            }
        };
        let Some(confinement) = confinement else {
            return Err(ToolResult::failure(
                id,
                "a staged run must be confined",
                Recoverable::No,
            ));
        };
        let layer = staging.begin(session, id.as_str()).map_err(|e| {
            ToolResult::failure(
                id,
                format!("making the run's staged layer: {e}"),
                Recoverable::Yes,
            )
        })?;
        match staging.overlays(&layer) {
            Ok(o) => confinement.overlays = o,
            Err(why) => {
                layer.remove();
                return Err(ToolResult::failure_of(
                    id,
                    ToolErrorKind::NotAllowed,
                    format!("the run cannot be staged: {why}"),
                    Recoverable::No,
                ));
            }
        }
        Ok(Some(layer))
    }

    /// The checks before a run: confinable here, `argv0` allowed and unchanged since the tool
    /// was built, the namespace's views intact. Gives the policy, the canonical program and
    /// the `argv[0]` to run it under.
    fn checked(
        &self,
        id: &crate::ids::ToolInvocationId,
        argv0: &str,
    ) -> Result<(&Policy, PathBuf, String), ToolResult> {
        let policy = self.policy.as_ref().map_err(|r| {
            ToolResult::failure_of(
                id,
                ToolErrorKind::NotAllowed,
                format!("the shell cannot be confined as required: {}", r.reason),
                Recoverable::No,
            )
        })?;
        let permitted = self.permitted(argv0).ok_or_else(|| {
            ToolResult::failure_of(
                id,
                ToolErrorKind::NotAllowed,
                format!(
                    "{:?} is not an allowed executable; allowed: [{}]",
                    argv0,
                    self.allowed
                        .iter()
                        .map(|a| a.canonical.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Recoverable::No,
            )
        })?;
        let (program, arg0, allowed) = permitted;
        if Pin::of(&program).as_ref() != Some(&allowed.pin) {
            return Err(ToolResult::failure_of(
                id,
                ToolErrorKind::NotAllowed,
                format!(
                    "{} changed since the shell tool was built (replaced or rewritten); it is not run",
                    program.display()
                ),
                Recoverable::No,
            ));
        }
        // The run's namespace shows each working dir and the temp base as they were when the
        // tool was built: one removed and made again since is not what the run would see.
        if let Some(held) = &policy.held {
            held.check_views().map_err(|p| {
                ToolResult::failure_of(
                    id,
                    ToolErrorKind::Io,
                    format!(
                        "{} was removed (and perhaps made again) since the shell tool was built; \
                         its runs would not see it: build the tool again (a new runtime)",
                        p.display()
                    ),
                    Recoverable::No,
                )
            })?;
        }
        Ok((policy, program, arg0))
    }

    /// The run's network end and, with an allowlist, its own proxy; `env` gets the run's
    /// variables (the proxy's in place of any configured ones with an allowlist).
    fn network_for(
        &self,
        id: &crate::ids::ToolInvocationId,
        policy: &Policy,
        env: &mut Vec<(String, String)>,
    ) -> Result<(Option<RunProxy>, NetEnd), ToolResult> {
        // With an allowlist, the run's own proxy: started before the run, given the listener
        // its supervisor makes in the run's network namespace (or, mediated, the listener of
        // the run's seccomp filter), stopped after the run.
        let (proxy, net_end) = match &policy.network {
            RunNetwork::Proxied(rules, route) => {
                let (host_end, run_end) = crate::sys::net::socketpair().map_err(|e| {
                    ToolResult::failure(
                        id,
                        format!("the run's proxy socket: {e}"),
                        Recoverable::Yes,
                    )
                })?;
                let proxy = RunProxy::start(rules.clone(), host_end, *route).map_err(|e| {
                    ToolResult::failure(
                        id,
                        format!("starting the run's proxy: {e}"),
                        Recoverable::Yes,
                    )
                })?;
                env.extend(
                    self.env
                        .iter()
                        .filter(|(k, _)| !network::PROXY_VARIABLES.contains(&k.as_str()))
                        .cloned(),
                );
                env.extend(network::proxy_environment());
                let net = match route {
                    Route::Namespace => RunNet::Namespace {
                        sock: run_end.as_raw_fd(),
                        port: network::PROXY_PORT,
                    },
                    Route::Mediated => RunNet::Mediated {
                        sock: run_end.as_raw_fd(),
                    },
                };
                (Some(proxy), Some((Some(run_end), net)))
            }
            RunNetwork::Loopback => {
                env.extend(self.env.iter().cloned());
                (None, Some((None, RunNet::Loopback)))
            }
            RunNetwork::Off | RunNetwork::Open => {
                env.extend(self.env.iter().cloned());
                (None, None)
            }
        };
        Ok((proxy, net_end))
    }

    /// Starts `command` as a long-lived server (an MCP server): confined and contained as a
    /// run, with a pipe for its stdin, ended at [`MAX_TIMEOUT`] at the latest. The cleanup
    /// runs once every process of it is gone.
    pub(crate) fn start_server(&self, command: &[String]) -> Result<(Started, Cleanup), String> {
        let request = ToolRequest::json("mcp", "shell", serde_json::json!({ "argv": command }))?;
        let argv: Vec<&str> = command.iter().map(String::as_str).collect();
        let reason = |r: ToolResult| match r {
            ToolResult::Failure { reason, .. } => reason,
            ToolResult::Success { output, .. } => output,
        };
        let prepared = self.prepare(&request, &argv).map_err(reason)?;
        prepared.start(MAX_TIMEOUT, true).map_err(reason)
    }

    fn run(&self, request: &ToolRequest, cancel: &CancelToken) -> Result<ToolResult, ToolResult> {
        let id = &request.invocation_id;
        let ShellRequest {
            argv,
            background,
            timeout,
        } = self
            .read_request(request)
            .map_err(|(kind, r, again)| ToolResult::failure_of(id, kind, r, again))?;
        if background.is_some() && self.staging.is_some() {
            return Err(ToolResult::failure_of(
                id,
                ToolErrorKind::NotAllowed,
                "a staged shell runs no background jobs (a job's change set would outlive its \
                 call): run it to its end, or use a shell with workspace \"direct\"",
                Recoverable::No,
            ));
        }
        let prepared = self.prepare(request, &argv)?;
        match background {
            Some((table, options)) => start_job(request, prepared, table, options, timeout),
            None => self.run_to_end(id, prepared, timeout, cancel),
        }
    }

    /// Runs a prepared run until it ends (or its timeout or a cancel ends it), then gives
    /// back what it held and answers with its outcome.
    fn run_to_end(
        &self,
        id: &crate::ids::ToolInvocationId,
        prepared: Prepared<'_>,
        timeout: Duration,
        cancel: &CancelToken,
    ) -> Result<ToolResult, ToolResult> {
        let argv = prepared.argv_os();
        let out = spawn::run(&prepared.spec(&argv, timeout, self.output_cap, Some(cancel), false));
        drop(argv);
        let Prepared {
            policy,
            program,
            tmp,
            cwd,
            cgroup,
            proxy,
            net_end,
            mut layer,
            ..
        } = prepared;
        drop(net_end);
        // Every process of the run is gone: so is every client of the proxy.
        let network = proxy.map(|p| p.stop().to_json());
        let out = out.map_err(|e| {
            ToolResult::failure(
                id,
                format!("could not start {}: {e}", program.display()),
                Recoverable::No,
            )
        })?;
        drop(cwd);
        if let Some(cg) = cgroup {
            policy.recycle_cgroup(cg);
        }
        self.recycle(tmp);
        let result = outcome(id, &out, network, timeout);
        match (layer.0.take(), &self.staging) {
            (Some(l), Some(Ok(staging))) => Ok(settle(id, staging, l, result)),
            _ => Ok(result),
        }
    }
}

/// Starts a prepared run as a background job in `table`: its slot is taken before its
/// program starts, so racing starts respect the session's bound (a request refused by the
/// checks never holds one); answers with the job's id.
fn start_job(
    request: &ToolRequest,
    prepared: Prepared<'_>,
    table: &dyn Background,
    options: &JobsOptions,
    timeout: Duration,
) -> Result<ToolResult, ToolResult> {
    let id = &request.invocation_id;
    let slot = table
        .reserve(request.session_id.as_str(), options.max_per_session)
        .map_err(|e| {
            ToolResult::failure_of(
                id,
                ToolErrorKind::NotAllowed,
                e.to_string(),
                Recoverable::Yes,
            )
        })?;
    let command = prepared.argv.clone();
    let (started, cleanup) = prepared.start(timeout, false)?;
    let job_id = slot
        .launch(
            started,
            Launch {
                invocation_id: id.to_string(),
                command,
                timeout,
                buffer_bytes: options.buffer_bytes,
                cleanup,
            },
        )
        .map_err(|e| ToolResult::failure(id, e, Recoverable::Yes))?;
    let data = serde_json::json!({"job_id": job_id, "background": true,
                                  "timeout_ms": timeout.as_millis() as u64});
    Ok(ToolResult::Success {
        invocation_id: id.clone(),
        output: format!(
            "started background job {job_id}; read its output, wait for it or stop it with the jobs tool"
        ),
        metadata: BTreeMap::from([("job_id".to_owned(), job_id)]),
        data: Some(data),
    })
}

/// A staged run's end: its change set read and settled as the policy says, and the run's
/// answer with it (`data.workspace`). A run that succeeded but whose change set could not be
/// promoted (a conflict, a bound) fails: nothing of it was applied.
fn settle(
    id: &crate::ids::ToolInvocationId,
    staging: &Staging,
    layer: RunLayer,
    result: ToolResult,
) -> ToolResult {
    let staged = match staging.finish(layer, result.is_success()) {
        Ok(s) => s,
        Err(e) => {
            let reason = format!("reading the run's change set failed ({e}); it was discarded");
            return ToolResult::failure(id, reason, Recoverable::Yes);
        }
    };
    let mut data = result
        .data()
        .cloned()
        .unwrap_or_else(|| serde_json::json!({}));
    data["workspace"] = staged.to_json();
    let refused = match &staged.settled {
        Settled::Refused(e) => Some((
            match e {
                crate::workspace::PromoteError::Conflict { .. } => ToolErrorKind::Conflict,
                _ => ToolErrorKind::Io,
            },
            e.to_string(),
        )),
        Settled::Discarded(why) if result.is_success() => Some((
            ToolErrorKind::TooLarge,
            format!("its change set was discarded: {why}"),
        )),
        _ => None,
    };
    match (refused, result) {
        (Some((kind, why)), ToolResult::Success { .. }) => {
            let reason = format!("the run succeeded, but {why}");
            ToolResult::failure_of(id, kind, reason, Recoverable::No).with_data(data)
        }
        (_, r) => r.with_data(data),
    }
}

/// A captured stream as text, with a note of what was dropped past the cap.
fn render(c: &Captured) -> String {
    let mut s = String::from_utf8_lossy(&c.bytes).into_owned();
    if c.truncated() {
        s.push_str(&format!(
            "\n[output truncated: {} more bytes dropped]",
            c.dropped
        ));
    }
    s
}

/// A finished run's answer: stdout on exit 0; else what ended it (a cancel, the timeout, an
/// exit code, a signal) and its streams; the run as data either way, with what its proxy saw.
fn outcome(
    id: &crate::ids::ToolInvocationId,
    out: &RunOutput,
    network: Option<serde_json::Value>,
    timeout: Duration,
) -> ToolResult {
    let mut metadata = BTreeMap::new();
    match out.exit {
        Exit::Code(c) => metadata.insert("exit_code".into(), c.to_string()),
        Exit::Signal(s) => metadata.insert("signal".into(), s.to_string()),
    };
    metadata.insert(
        "stdout_truncated".into(),
        out.stdout.truncated().to_string(),
    );
    metadata.insert(
        "stderr_truncated".into(),
        out.stderr.truncated().to_string(),
    );
    metadata.insert("duration_ms".into(), out.duration.as_millis().to_string());
    let mut data = run_data(out);
    if let Some(n) = network {
        data["network"] = n;
    }
    if out.cancelled || out.timed_out {
        let (kind, what, recoverable) = if out.cancelled {
            let ms = out.duration.as_millis();
            let what = format!("cancelled by the host after {ms} ms");
            (ToolErrorKind::Cancelled, what, Recoverable::No)
        } else {
            let what = format!("timed out after {} ms", timeout.as_millis());
            (ToolErrorKind::TimedOut, what, Recoverable::Yes)
        };
        let reason = format!(
            "{what}; every process of the run was killed. stdout: {}\nstderr: {}",
            render(&out.stdout),
            render(&out.stderr)
        );
        return ToolResult::failure_of(id, kind, reason, recoverable).with_data(data);
    }
    match out.exit {
        Exit::Code(0) => ToolResult::Success {
            invocation_id: id.clone(),
            output: render(&out.stdout),
            metadata,
            data: Some(data),
        },
        Exit::Code(c) => {
            let stderr = render(&out.stderr);
            let reason = if stderr.trim().is_empty() {
                format!("exited with code {c} and no stderr")
            } else {
                format!("{stderr}\n[exit code {c}]")
            };
            ToolResult::failure_of(id, ToolErrorKind::NonZeroExit, reason, Recoverable::No)
                .with_data(data)
        }
        Exit::Signal(sig) => ToolResult::failure_of(
            id,
            ToolErrorKind::Signalled,
            format!("killed by signal {sig}. stderr: {}", render(&out.stderr)),
            Recoverable::No,
        )
        .with_data(data),
    }
}

/// The run as data: exit code or signal, both streams (as text when UTF-8, else lossy text
/// plus the exact bytes in base64), truncation, duration.
fn run_data(out: &RunOutput) -> serde_json::Value {
    let mut v = serde_json::json!({
        "exit_code": match out.exit { Exit::Code(c) => Some(c), Exit::Signal(_) => None },
        "signal": match out.exit { Exit::Signal(s) => Some(s), Exit::Code(_) => None },
        "timed_out": out.timed_out,
        "cancelled": out.cancelled,
        "duration_ms": out.duration.as_millis() as u64,
    });
    for (name, c) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        match std::str::from_utf8(&c.bytes) {
            Ok(text) => v[name] = text.into(),
            Err(_) => {
                v[name] = String::from_utf8_lossy(&c.bytes).into_owned().into();
                v[format!("{name}_base64")] = crate::text::base64(&c.bytes).into();
            }
        }
        v[format!("{name}_truncated")] = c.truncated().into();
        v[format!("{name}_dropped_bytes")] = c.dropped.into();
    }
    v
}

impl Tool for ShellTool {
    crate::tools::table::identity_from_row!();

    fn required_capabilities(&self) -> &[ToolCapability] {
        &[ToolCapability::ShellExec, ToolCapability::ProcessSpawn]
    }

    fn isolation(&self) -> Option<&AppliedPolicy> {
        Some(self.applied_policy())
    }

    fn workspace(&self) -> Option<&dyn crate::workspace::Workspace> {
        match &self.staging {
            Some(Ok(s)) => Some(s),
            _ => None,
        }
    }

    fn validate_request(&self, request: &ToolRequest) -> ValidationResult {
        // Only a malformed request is invalid; background runs being off is refused by the run.
        match self.read_request(request) {
            Err((ToolErrorKind::InvalidRequest, reason, _)) => ValidationResult::Invalid { reason },
            Ok(_) | Err(_) => ValidationResult::Valid,
        }
    }

    fn execute(&self, request: &ToolRequest) -> ToolResult {
        self.execute_cancellable(request, &CancelToken::new())
    }

    fn execute_cancellable(&self, request: &ToolRequest, cancel: &CancelToken) -> ToolResult {
        if cancel.is_cancelled() {
            return crate::tools::contract::cancelled_before_start(request);
        }
        match self.run(request, cancel) {
            Ok(r) | Err(r) => r,
        }
    }
}
