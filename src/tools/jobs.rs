//! The `jobs` tool: what a model calls to list its session's background jobs, read their
//! output since a cursor, wait for one, signal it, or stop it. It reaches only jobs of the
//! request's own session.

use crate::cancel::CancelToken;
use crate::services::jobs::{signal_number, JobCursor, JobError, JobStatus, JobTable, STOP_GRACE};
use crate::settings::{ConfigError, Section};
use crate::tools::table::{BuildContext, BuiltinTool, ToolRow};
use crate::tools::Recoverable;
use crate::tools::{
    json_kind, Tier, Tool, ToolCapability, ToolError, ToolErrorKind, ToolRequest, ToolResult,
    ValidationResult,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// The longest one `wait` blocks; a model waits again for longer.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// The most bytes of each stream one `read` returns.
const MAX_READ: u64 = 256 * 1024;

/// The jobs tool's description.
pub const DESCRIPTION: &str = "lists, reads the output of, waits for, signals or stops the \
     background jobs this session started (a shell request with \"background\": true)";

/// The jobs tool's parameters.
pub(crate) fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "operation": {"type": "string", "enum": ["list", "read", "wait", "signal", "stop"]},
            "job_id": {"type": "string", "description": "the id the shell returned"},
            "stdout_cursor": {"type": "integer", "minimum": 0,
                              "description": "read: stdout bytes already read (the last read's next cursor)"},
            "stderr_cursor": {"type": "integer", "minimum": 0,
                              "description": "read: as stdout_cursor, for stderr"},
            "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_READ,
                          "description": "read: most bytes of each stream returned"},
            "timeout_ms": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT.as_millis() as u64,
                           "description": "wait: how long to wait for the job to end"},
            "signal": {"type": "string", "description": "signal: INT, TERM, KILL, HUP, QUIT, USR1, USR2, STOP or CONT"}
        },
        "required": ["operation"],
        "additionalProperties": false
    })
}

/// The jobs tool's config section (`tools.jobs`): nothing besides `enabled`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobsToolOptions {}

impl Section for JobsToolOptions {
    fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

/// The `jobs` tool. See the module docs.
#[derive(Debug)]
pub struct JobsTool {
    table: Arc<JobTable>,
}

impl JobsTool {
    /// The tool over `table`.
    pub fn new(table: Arc<JobTable>) -> Self {
        JobsTool { table }
    }

    fn run(&self, r: &ToolRequest, cancel: &CancelToken) -> ToolResult {
        let id = &r.invocation_id;
        match operate(&self.table, r.session_id.as_str(), &r.parameters, cancel) {
            Ok(data) => ToolResult::Success {
                invocation_id: id.clone(),
                output: data.to_string(),
                metadata: Default::default(),
                data: Some(data),
            },
            Err((kind, reason)) => ToolResult::failure_of(id, kind, reason, Recoverable::Yes),
        }
    }
}

/// One request on `session`'s jobs, with the `jobs` tool's parameters; its answer as JSON, or
/// the kind of failure (`invalid_request` for a bad parameter or an unknown job) and why.
pub(crate) fn operate(
    table: &JobTable,
    session: &str,
    params: &Map<String, Value>,
    cancel: &CancelToken,
) -> Result<Value, Refused> {
    let p = Params(params);
    let operation = shape(params).map_err(invalid)?;
    Ok(match operation {
        "list" => {
            let jobs: Vec<Value> = table
                .list(session)
                .into_iter()
                .map(|j| {
                    let mut v = j.status.to_json();
                    v["job_id"] = json!(j.job_id);
                    v["command"] = json!(j.command);
                    v
                })
                .collect();
            json!({"jobs": jobs})
        }
        "read" => read_output(table, session, &p)?,
        "wait" => wait_for(table, session, &p, cancel)?,
        "signal" => {
            let name = p.string("signal")?.unwrap_or("TERM");
            let sig = signal_number(name).map_err(job_err)?;
            table.signal(session, p.job_id()?, sig).map_err(job_err)?;
            json!({"sent": name.to_ascii_uppercase()})
        }
        "stop" => {
            let status = table
                .stop(session, p.job_id()?, STOP_GRACE)
                .map_err(job_err)?;
            json!({"status": status.to_json()})
        }
        // `shape` let only the five through.
        other => return Err(invalid(format!("unknown operation {other:?}"))),
    })
}

/// Why an operation was refused: its kind and reason.
type Refused = (ToolErrorKind, String);

fn invalid(reason: String) -> Refused {
    (ToolErrorKind::InvalidRequest, reason)
}

/// A job table's error as the tool reports it: a request naming no job of the session, or a
/// signal that does not exist, is invalid; anything else is I/O.
fn job_err(e: JobError) -> Refused {
    let kind = match e {
        JobError::Unknown { .. } | JobError::BadSignal { .. } => ToolErrorKind::InvalidRequest,
        _ => ToolErrorKind::Io,
    };
    (kind, e.to_string())
}

/// An operation's parameters, each read and checked where it is used.
struct Params<'a>(&'a Map<String, Value>);

impl Params<'_> {
    /// A string parameter; absent or `null` is `None`.
    fn string(&self, name: &str) -> Result<Option<&str>, Refused> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(invalid(format!(
                "parameter {name:?} must be a string, got {}",
                json_kind(v)
            ))),
        }
    }

    /// The `job_id` every operation but `list` needs.
    fn job_id(&self) -> Result<&str, Refused> {
        self.string("job_id")?
            .ok_or_else(|| invalid("missing required parameter \"job_id\"".into()))
    }

    /// An integer parameter from 0 to `max`; absent or `null` is `default`.
    fn uint(&self, name: &str, default: u64, max: u64) -> Result<u64, Refused> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => match v.as_u64() {
                Some(n) if n <= max => Ok(n),
                _ => Err(invalid(format!(
                    "parameter {name:?} must be an integer from 0 to {max}, got {}",
                    if v.is_number() {
                        v.to_string()
                    } else {
                        json_kind(v).to_owned()
                    }
                ))),
            },
        }
    }
}

/// `read`: a job's output since the cursors, at most `max_bytes` of each stream.
fn read_output(table: &JobTable, session: &str, p: &Params<'_>) -> Result<Value, Refused> {
    let cursor = JobCursor {
        stdout: p.uint("stdout_cursor", 0, u64::MAX)?,
        stderr: p.uint("stderr_cursor", 0, u64::MAX)?,
    };
    let max = p.uint("max_bytes", 64 * 1024, MAX_READ)?.max(1) as usize;
    let out = table
        .read(session, p.job_id()?, cursor, max)
        .map_err(job_err)?;
    Ok(json!({
        "stdout": String::from_utf8_lossy(&out.stdout),
        "stderr": String::from_utf8_lossy(&out.stderr),
        "stdout_cursor": out.cursor.stdout,
        "stderr_cursor": out.cursor.stderr,
        "stdout_dropped": out.stdout_dropped,
        "stderr_dropped": out.stderr_dropped,
        "status": out.status.to_json(),
    }))
}

/// `wait`: until the job ends, `timeout_ms` passes or the host cancels (which ends the wait,
/// not the job).
fn wait_for(
    table: &JobTable,
    session: &str,
    p: &Params<'_>,
    cancel: &CancelToken,
) -> Result<Value, Refused> {
    let ms = p.uint("timeout_ms", 0, MAX_WAIT.as_millis() as u64)?;
    let job = p.job_id()?;
    let deadline = std::time::Instant::now() + Duration::from_millis(ms);
    // In slices, so a cancel by the host ends the wait (not the job).
    let status = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let slice = left.min(Duration::from_millis(50));
        let status = table.wait(session, job, slice).map_err(job_err)?;
        if left.is_zero() || cancel.is_cancelled() || !matches!(status, JobStatus::Running { .. }) {
            break status;
        }
    };
    Ok(json!({"status": status.to_json()}))
}

/// The parameters the schema names.
const PARAMETERS: &[&str] = &[
    "operation",
    "job_id",
    "stdout_cursor",
    "stderr_cursor",
    "max_bytes",
    "timeout_ms",
    "signal",
];

/// A request's operation, when it names one of the five and no parameter the schema lacks;
/// else why not. What approval and the call both check.
fn shape(params: &Map<String, Value>) -> Result<&str, String> {
    if let Some(k) = params.keys().find(|k| !PARAMETERS.contains(&k.as_str())) {
        return Err(format!("unknown parameter {k:?}"));
    }
    match params.get("operation") {
        Some(Value::String(op))
            if matches!(op.as_str(), "list" | "read" | "wait" | "signal" | "stop") =>
        {
            Ok(op)
        }
        Some(Value::String(other)) => Err(format!(
            "unknown operation {other:?}; one of: list, read, wait, signal, stop"
        )),
        Some(v) => Err(format!(
            "parameter \"operation\" must be a string, got {}",
            json_kind(v)
        )),
        None => Err("missing required parameter \"operation\"".into()),
    }
}

impl Tool for JobsTool {
    crate::tools::table::identity_from_row!();

    fn required_capabilities(&self) -> &[ToolCapability] {
        &[]
    }

    fn validate_request(&self, r: &ToolRequest) -> ValidationResult {
        match shape(&r.parameters) {
            Ok(_) => ValidationResult::Valid,
            Err(reason) => ValidationResult::Invalid { reason },
        }
    }

    fn execute(&self, r: &ToolRequest) -> ToolResult {
        self.execute_cancellable(r, &CancelToken::new())
    }

    fn execute_cancellable(&self, r: &ToolRequest, cancel: &CancelToken) -> ToolResult {
        self.run(r, cancel)
    }
}

impl BuiltinTool for JobsTool {
    const ROW: ToolRow = ToolRow::new::<Self>("jobs", Tier::T1, DESCRIPTION, schema);
    type Config = JobsToolOptions;

    fn build(_config: &JobsToolOptions, context: &BuildContext) -> Result<Self, ToolError> {
        context
            .jobs
            .clone()
            .map(JobsTool::new)
            .ok_or_else(|| ToolError::InvalidSetting {
                field: "enabled",
                reason: "the jobs tool needs a runtime's job table (build it with Runtime::new)"
                    .into(),
            })
    }

    fn explain(_config: &JobsToolOptions) -> Vec<(&'static str, String)> {
        vec![(
            "",
            "enabled: a session may list, read, wait for, signal and stop its own background jobs"
                .into(),
        )]
    }
}

#[cfg(test)]
mod tests {
    /// The check's list of parameters is the schema's.
    #[test]
    fn the_parameters_checked_are_the_schema_s() {
        let schema = super::schema();
        let mut named: Vec<&str> = schema["properties"]
            .as_object()
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let mut listed = super::PARAMETERS.to_vec();
        named.sort_unstable();
        listed.sort_unstable();
        assert_eq!(named, listed);
    }
}
