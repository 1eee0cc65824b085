//! [`ShellTool`]: runs one executable from an allowlist, by argv, never through a shell.

use super::fs::{Located, Roots};
use super::params::{json_kind, optional_str};
use super::process::{self, resolve_both, Exit, RunSpec, FIXED_PATH};
use super::{Tier, Tool, ToolCapability, ToolError, ToolRequest, ToolResult, ValidationResult};
use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Duration;

/// Default cap on captured stdout, and separately on stderr: 1 MiB, enough for any listing or
/// test log an agent reads, small enough that an output bomb cannot grow the host.
pub const DEFAULT_OUTPUT_CAP: usize = 1024 * 1024;

/// Settings of a [`ShellTool`].
#[derive(Clone, Debug, PartialEq)]
pub struct ShellOptions {
    /// Executables that may run, by name (resolved through the fixed PATH) or absolute path;
    /// default empty: everything is denied.
    pub allowed_executables: Vec<String>,
    /// Wall-clock limit of one run; default 30 s.
    pub timeout: Duration,
    /// Cap on captured stdout and on stderr, each; default [`DEFAULT_OUTPUT_CAP`].
    pub output_cap: usize,
    /// Variables the child gets besides `PATH`; default none.
    pub env: BTreeMap<String, String>,
    /// Pass variables whose names look like secrets; default false.
    pub force_secret_env: bool,
    /// Directories a request's `cwd` may lie in; default none (no `cwd` allowed).
    pub working_roots: Vec<PathBuf>,
}

impl Default for ShellOptions {
    fn default() -> Self {
        ShellOptions {
            allowed_executables: Vec::new(),
            timeout: Duration::from_secs(30),
            output_cap: DEFAULT_OUTPUT_CAP,
            env: BTreeMap::new(),
            force_secret_env: false,
            working_roots: Vec::new(),
        }
    }
}

/// Runs an allowlisted executable with argv from the request (`{"argv": ["ls", "-l"]}`, and an
/// optional `"cwd"` inside a working root). The child gets a cleared environment (a fixed
/// `PATH` plus configured variables), stdin from `/dev/null`, its own process group, and is
/// killed with its whole group at the timeout. Tier T2.
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
}

fn file_name(p: &std::path::Path) -> std::ffi::OsString {
    p.file_name().map(|n| n.to_os_string()).unwrap_or_default()
}

/// Whether a variable name looks like it carries a secret.
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["KEY", "SECRET", "TOKEN", "PASSWORD"]
        .iter()
        .any(|w| upper.contains(w))
}

impl ShellTool {
    /// Resolves every allowed executable once, through the fixed PATH, to a canonical path.
    ///
    /// # Errors
    /// [`ToolError::ExecutableNotFound`], [`ToolError::SecretEnvVar`], [`ToolError::Root`],
    /// [`ToolError::InvalidSetting`] for a zero timeout or cap.
    pub fn new(options: ShellOptions) -> Result<Self, ToolError> {
        if options.timeout.is_zero() {
            return Err(ToolError::InvalidSetting {
                field: "timeout_ms",
                reason: "must be greater than 0".into(),
            });
        }
        if options.output_cap == 0 {
            return Err(ToolError::InvalidSetting {
                field: "output_cap_bytes",
                reason: "must be greater than 0".into(),
            });
        }
        let mut allowed = Vec::new();
        for name in &options.allowed_executables {
            let (lexical, canonical) =
                resolve_both(name).ok_or_else(|| ToolError::ExecutableNotFound {
                    name: name.clone(),
                    path: FIXED_PATH,
                })?;
            allowed.push(Allowed {
                canonical,
                name: file_name(&lexical),
            });
        }
        for name in options.env.keys() {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(ToolError::InvalidSetting {
                    field: "env",
                    reason: format!("{name:?} is not a valid variable name"),
                });
            }
            if name == "PATH" {
                return Err(ToolError::InvalidSetting {
                    field: "env",
                    reason: format!("PATH is fixed to {FIXED_PATH}"),
                });
            }
            if looks_secret(name) && !options.force_secret_env {
                return Err(ToolError::SecretEnvVar { name: name.clone() });
            }
        }
        let roots = Roots::open(&options.working_roots).map_err(ToolError::Root)?;
        Ok(ShellTool {
            allowed,
            env: options.env.into_iter().collect(),
            timeout: options.timeout,
            output_cap: options.output_cap,
            roots,
        })
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

    /// The canonical program and the `argv[0]` to run it under, if `argv0` is allowed.
    fn permitted(&self, argv0: &str) -> Option<(PathBuf, String)> {
        if self.allowed.is_empty() {
            return None;
        }
        let (lexical, canonical) = resolve_both(argv0)?;
        let name = file_name(&lexical);
        let ok = self
            .allowed
            .iter()
            .any(|a| a.canonical == canonical && a.name == name);
        ok.then(|| (canonical, name.to_string_lossy().into_owned()))
    }

    fn run(&self, request: &ToolRequest) -> Result<ToolResult, ToolResult> {
        let id = &request.invocation_id;
        let argv = self
            .argv(request)
            .map_err(|r| ToolResult::failure(id, r, true))?;
        let (program, arg0) = self.permitted(argv[0]).ok_or_else(|| {
            ToolResult::failure(
                id,
                format!(
                    "{:?} is not an allowed executable; allowed: [{}]",
                    argv[0],
                    self.allowed
                        .iter()
                        .map(|a| a.canonical.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                false,
            )
        })?;
        // A cwd is opened beneath its root and handed to the child as our own fd, so nothing
        // can swap a symlink in between the check and the chdir.
        let cwd_fd = match optional_str(request, "cwd")? {
            None => None,
            Some(cwd) => {
                let loc: Located = self
                    .roots
                    .locate(cwd)
                    .map_err(|e| ToolResult::failure(id, format!("cwd: {e}"), false))?;
                let fd = self
                    .roots
                    .open_at(&loc, libc::O_PATH | libc::O_DIRECTORY, 0)
                    .map_err(|e| ToolResult::failure(id, format!("cwd: {e}"), e.recoverable()))?;
                Some(fd)
            }
        };
        let cwd_path = cwd_fd
            .as_ref()
            .map(|fd| PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())));
        let args: Vec<String> = argv[1..].iter().map(|s| (*s).to_owned()).collect();
        let spec = RunSpec {
            program: &program,
            arg0: Some(&arg0),
            args: &args,
            env: &self.env,
            cwd: cwd_path.as_deref(),
            timeout: self.timeout,
            output_cap: self.output_cap,
        };
        let out = process::run(&spec).map_err(|e| {
            ToolResult::failure(
                id,
                format!("could not start {}: {e}", program.display()),
                false,
            )
        })?;
        drop(cwd_fd);
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
        let render = |c: &process::Captured| {
            let mut s = String::from_utf8_lossy(&c.bytes).into_owned();
            if c.truncated() {
                s.push_str(&format!(
                    "\n[output truncated: {} more bytes dropped]",
                    c.dropped
                ));
            }
            s
        };
        if out.timed_out {
            return Ok(ToolResult::failure(
                id,
                format!(
                    "timed out after {} ms; the process group was killed. stderr: {}",
                    self.timeout.as_millis(),
                    render(&out.stderr)
                ),
                true,
            ));
        }
        Ok(match out.exit {
            Exit::Code(0) => ToolResult::Success {
                invocation_id: id.clone(),
                output: render(&out.stdout),
                metadata,
            },
            Exit::Code(c) => {
                let stderr = render(&out.stderr);
                let reason = if stderr.trim().is_empty() {
                    format!("exited with code {c} and no stderr")
                } else {
                    format!("{stderr}\n[exit code {c}]")
                };
                ToolResult::failure(id, reason, false)
            }
            Exit::Signal(s) => ToolResult::failure(
                id,
                format!("killed by signal {s}. stderr: {}", render(&out.stderr)),
                false,
            ),
        })
    }
}

impl Tool for ShellTool {
    fn name(&self) -> &str {
        "shell"
    }

    fn tier(&self) -> Tier {
        Tier::T2
    }

    fn required_capabilities(&self) -> &[ToolCapability] {
        &[ToolCapability::ShellExec, ToolCapability::ProcessSpawn]
    }

    fn validate_request(&self, request: &ToolRequest) -> ValidationResult {
        match self.argv(request) {
            Ok(_) => ValidationResult::Valid,
            Err(reason) => ValidationResult::Invalid { reason },
        }
    }

    fn execute(&self, request: &ToolRequest) -> ToolResult {
        match self.run(request) {
            Ok(r) | Err(r) => r,
        }
    }
}
