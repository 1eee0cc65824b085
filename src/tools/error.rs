use super::fs::ConfineError;
use std::fmt;

/// Why a tool or a registry could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum ToolError {
    /// Two tools share a name.
    DuplicateTool {
        /// The name.
        name: String,
    },
    /// An allowed executable could not be found through the fixed PATH.
    ExecutableNotFound {
        /// The name as configured.
        name: String,
        /// The PATH searched.
        path: &'static str,
    },
    /// An environment variable for the shell looks like a secret and was not forced.
    SecretEnvVar {
        /// The variable's name.
        name: String,
    },
    /// An allowed root could not be opened.
    Root(ConfineError),
    /// A setting breaks its config section's rules (the same check and message a config
    /// gets, the field named relative to the section).
    Config(crate::settings::ConfigError),
    /// A setting is out of range.
    InvalidSetting {
        /// The setting.
        field: &'static str,
        /// Why.
        reason: String,
    },
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolError::DuplicateTool { name } => {
                write!(f, "two tools are named {name:?}; tool names must be unique")
            }
            ToolError::ExecutableNotFound { name, path } => write!(
                f,
                "allowed executable {name:?} was not found through PATH={path}; install it or remove it from the allowlist"
            ),
            ToolError::SecretEnvVar { name } => write!(
                f,
                "environment variable {name} looks like a secret (its name holds KEY, SECRET, TOKEN, PASSWORD, PASSWD, CREDENTIAL, COOKIE or PRIVATE, ends in _PAT, is DATABASE_URL, or its value holds user:password@); set force_secret_env to pass it anyway"
            ),
            ToolError::Root(e) => write!(f, "allowed path: {e}"),
            ToolError::Config(e) => write!(f, "{e}"),
            ToolError::InvalidSetting { field, reason } => write!(f, "{field}: {reason}"),
        }
    }
}

impl std::error::Error for ToolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ToolError::Root(e) => Some(e),
            ToolError::Config(e) => Some(e),
            ToolError::DuplicateTool { .. }
            | ToolError::ExecutableNotFound { .. }
            | ToolError::SecretEnvVar { .. }
            | ToolError::InvalidSetting { .. } => None,
        }
    }
}
