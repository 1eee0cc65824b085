//! Tools an agent may run: the contracts, the registry, and the built-in tools, listed in one
//! table ([`BUILTIN_TOOLS`]) that the config, the registry's listing and `correx doctor` read.
//!
//! ```
//! use correx::{FileReadTool, Tool, ToolRequest, SessionId};
//! let dir = std::env::temp_dir().join(format!("correx-doc-tools-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! std::fs::write(dir.join("notes.txt"), "hello")?;
//! let tool = FileReadTool::new(&[dir.clone()])?;
//! let params = serde_json::json!({"operation": "read", "path": "notes.txt"});
//! let req = ToolRequest::new(SessionId::from("s"), "file_read", params.as_object().cloned().unwrap_or_default());
//! assert!(tool.execute(&req).is_success());
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod contract;
mod describe;
mod error;
pub(crate) mod fs;
pub(crate) mod jobs;
mod params;
pub(crate) mod process;
mod registry;
pub(crate) mod shell;
mod table;

pub use contract::{
    FileAffectingTool, Recoverable, Tier, Tool, ToolCapability, ToolErrorKind, ToolExecutor,
    ToolRequest, ToolResult, ValidationResult,
};
pub use describe::ToolDescription;
pub use error::ToolError;
pub use fs::{
    ConfineError, FileEditTool, FileReadTool, FileToolConfig, FileWriteTool, ResolveMode, Roots,
    DEFAULT_MAX_READ_BYTES,
};
pub use jobs::{JobsTool, JobsToolOptions};
pub(crate) use params::json_kind;
pub use registry::{DispatchingToolExecutor, ToolRegistry, ToolSource};
pub use shell::{
    looks_secret, JobsOptions, ShellOptions, ShellTool, DEFAULT_OUTPUT_CAP, MAX_TIMEOUT,
};
pub use table::{BuildContext, BuiltinTool, ToolConfig, ToolRow, BUILTIN_TOOLS};
