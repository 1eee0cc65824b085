use crate::events::EventStoreError;
use std::fmt;
use std::path::PathBuf;

/// Why a model could not be loaded or unloaded. Load errors carry the last lines of the
/// server's log.
#[derive(Debug)]
#[non_exhaustive]
pub enum ModelLoadError {
    /// The llama-server binary does not exist or is not executable.
    BinaryNotFound {
        /// The configured path.
        path: PathBuf,
    },
    /// The GGUF file does not exist.
    ModelFileMissing {
        /// The configured path.
        path: PathBuf,
    },
    /// Something already listens on the server's port, or answered health checks as a
    /// server that is not ours.
    PortInUse {
        /// The address.
        addr: String,
        /// What was seen.
        detail: String,
    },
    /// `models.isolation` cannot be applied as asked (a kernel without a layer `required`
    /// needs); nothing was started.
    Isolation {
        /// The model.
        model_id: String,
        /// What is missing and what to set instead.
        reason: String,
    },
    /// The server could not be started.
    Spawn {
        /// The binary.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// The log directory could not be created or the log opened.
    Log {
        /// The path.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// The server exited before it became healthy (a bad model file, a busy port, bad
    /// arguments).
    ExitedWhileLoading {
        /// How it ended.
        status: String,
        /// The last lines of its log.
        log_tail: Vec<String>,
    },
    /// The server did not become healthy in time; it was killed.
    Timeout {
        /// How long the manager waited, in milliseconds.
        waited_ms: u64,
        /// The last lines of its log.
        log_tail: Vec<String>,
    },
    /// The load was cancelled; the server was killed.
    Cancelled,
    /// The manager this provider belongs to was dropped.
    ManagerGone,
    /// The call waited for something that did not happen within the drain timeout, so nothing
    /// was changed: inferences still running on a model it must replace or unload, or room
    /// (`max_loaded`, the memory budget) held by models with inferences running or by servers
    /// still loading or stopping; or the queue of waiting loads is full (`max_queued`).
    Busy {
        /// The model the call was for.
        requested: String,
        /// The models with inferences running (comma-separated; empty when the room was held
        /// by servers starting or stopping).
        model_id: String,
        /// How many inferences were still running on them.
        in_flight: u32,
        /// In words, what the call waited for: inferences to finish, servers to finish loading
        /// or to stop, room in the queue.
        holding: String,
        /// How long the call waited, in milliseconds.
        waited_ms: u64,
    },
    /// The state changed but the event could not be recorded; the change was rolled back.
    Events(EventStoreError),
    /// The descriptor cannot describe a model (no path or endpoints, an empty id, a bad URL).
    InvalidDescriptor {
        /// The model's id as given.
        model_id: String,
        /// What is wrong.
        detail: String,
    },
    /// The model alone needs more memory than the manager's budget allows.
    OverBudget {
        /// The model.
        model_id: String,
        /// Its estimate: GGUF size plus KV cache at its context size.
        estimated_bytes: u64,
        /// The budget.
        budget_bytes: u64,
    },
    /// None of a remote model's endpoints answered its health check.
    EndpointsDown {
        /// The model.
        model_id: String,
        /// What each endpoint answered.
        detail: String,
    },
}

fn tail(f: &mut fmt::Formatter<'_>, lines: &[String]) -> fmt::Result {
    if lines.is_empty() {
        return f.write_str("; the server logged nothing");
    }
    f.write_str("; last log lines:")?;
    for l in lines.iter().rev().take(15).rev() {
        write!(f, "\n  {l}")?;
    }
    Ok(())
}

impl fmt::Display for ModelLoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelLoadError::BinaryNotFound { path } => write!(
                f,
                "llama-server not found at {}; run scripts/install-llama.sh or set the server path",
                path.display()
            ),
            ModelLoadError::ModelFileMissing { path } => {
                write!(
                    f,
                    "model file {} does not exist; check the model path",
                    path.display()
                )
            }
            ModelLoadError::PortInUse { addr, detail } => write!(
                f,
                "{addr} is already in use ({detail}); stop the other server or pick another port"
            ),
            ModelLoadError::Isolation { model_id, reason } => {
                write!(f, "model {model_id} cannot be loaded confined: {reason}")
            }
            ModelLoadError::Spawn { path, source } => {
                write!(f, "could not start {}: {source}", path.display())
            }
            ModelLoadError::Log { path, source } => {
                write!(
                    f,
                    "could not open the server log {}: {source}",
                    path.display()
                )
            }
            ModelLoadError::ExitedWhileLoading { status, log_tail } => {
                write!(f, "llama-server exited while loading ({status}); check the model file and arguments")?;
                tail(f, log_tail)
            }
            ModelLoadError::Timeout {
                waited_ms,
                log_tail,
            } => {
                write!(
                    f,
                    "llama-server not healthy after {} s; check the model path and its log",
                    waited_ms / 1000
                )?;
                tail(f, log_tail)
            }
            ModelLoadError::Cancelled => f.write_str("the load was cancelled"),
            ModelLoadError::Busy {
                requested,
                holding,
                waited_ms,
                ..
            } => write!(
                f,
                "model {requested}: waited {waited_ms} ms for {holding}; nothing was changed: retry when they finish, cancel them, or raise the drain timeout"
            ),
            ModelLoadError::ManagerGone => f.write_str("the model manager was dropped"),
            ModelLoadError::Events(e) => write!(f, "could not record the model event: {e}"),
            ModelLoadError::InvalidDescriptor { model_id, detail } => {
                write!(f, "model {model_id:?} is not a valid descriptor: {detail}")
            }
            ModelLoadError::OverBudget {
                model_id,
                estimated_bytes,
                budget_bytes,
            } => write!(
                f,
                "model {model_id} needs about {} MiB, more than the whole memory budget of {} MiB; raise models.memory_budget_mb or use a smaller context",
                estimated_bytes >> 20,
                budget_bytes >> 20
            ),
            ModelLoadError::EndpointsDown { model_id, detail } => write!(
                f,
                "no endpoint of model {model_id} can serve it ({detail}); check that its servers run, are reachable and serve this model"
            ),
        }
    }
}

impl std::error::Error for ModelLoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ModelLoadError::Spawn { source, .. } | ModelLoadError::Log { source, .. } => {
                Some(source)
            }
            ModelLoadError::Events(e) => Some(e),
            ModelLoadError::BinaryNotFound { .. }
            | ModelLoadError::ModelFileMissing { .. }
            | ModelLoadError::PortInUse { .. }
            | ModelLoadError::Isolation { .. }
            | ModelLoadError::ExitedWhileLoading { .. }
            | ModelLoadError::Timeout { .. }
            | ModelLoadError::Cancelled
            | ModelLoadError::Busy { .. }
            | ModelLoadError::InvalidDescriptor { .. }
            | ModelLoadError::OverBudget { .. }
            | ModelLoadError::EndpointsDown { .. }
            | ModelLoadError::ManagerGone => None,
        }
    }
}
