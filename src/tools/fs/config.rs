//! [`FileToolConfig`]: the file tools' config section (`tools.file_read`, `tools.file_write`,
//! `tools.file_edit`), and how the runtime builds each tool from it.

use super::{schema, FileEditTool, FileReadTool, FileWriteTool, Roots, DEFAULT_MAX_READ_BYTES};
use crate::settings::{self, ConfigError, Section};
use crate::tools::table::{BuildContext, BuiltinTool, ToolRow};
use crate::tools::{Tier, ToolError};
use serde::Deserialize;
use std::path::PathBuf;

/// A file tool's settings (config `tools.<tool>`, besides `enabled`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileToolConfig {
    /// Roots the tool may touch, absolute; default none (every path denied).
    pub allowed_paths: Vec<PathBuf>,
    /// Read cap in bytes (`file_read`); default 10 MiB.
    pub max_read_bytes: u64,
}

impl Default for FileToolConfig {
    fn default() -> Self {
        FileToolConfig {
            allowed_paths: Vec::new(),
            max_read_bytes: DEFAULT_MAX_READ_BYTES,
        }
    }
}

impl Section for FileToolConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        settings::absolute("allowed_paths", &self.allowed_paths)?;
        settings::positive("max_read_bytes", self.max_read_bytes)
    }
}

fn roots(config: &FileToolConfig) -> Result<Roots, ToolError> {
    Roots::open(&config.allowed_paths).map_err(ToolError::Root)
}

fn beneath(config: &FileToolConfig) -> (&'static str, String) {
    ("", format!("enabled beneath {:?}", config.allowed_paths))
}

impl BuiltinTool for FileReadTool {
    const ROW: ToolRow =
        ToolRow::new::<Self>("file_read", Tier::T1, schema::FILE_READ, schema::file_read);
    type Config = FileToolConfig;

    fn build(config: &FileToolConfig, _context: &BuildContext) -> Result<Self, ToolError> {
        FileReadTool::with_roots(roots(config)?, config.max_read_bytes)
    }

    fn explain(config: &FileToolConfig) -> Vec<(&'static str, String)> {
        let (field, text) = beneath(config);
        vec![(
            field,
            format!("{text}, reads up to {} bytes", config.max_read_bytes),
        )]
    }
}

/// The writing tools: built over their roots, never writing what a tool built before them
/// protects (the shell's executables).
macro_rules! writer {
    ($tool:ident, $name:literal, $tier:expr, $description:expr, $schema:expr) => {
        impl BuiltinTool for $tool {
            const ROW: ToolRow = ToolRow::new::<Self>($name, $tier, $description, $schema);
            type Config = FileToolConfig;

            fn build(config: &FileToolConfig, context: &BuildContext) -> Result<Self, ToolError> {
                Ok($tool::with_roots(roots(config)?).protecting(&context.protected))
            }

            fn explain(config: &FileToolConfig) -> Vec<(&'static str, String)> {
                vec![beneath(config)]
            }
        }
    };
}

writer!(
    FileWriteTool,
    "file_write",
    Tier::T2,
    schema::FILE_WRITE,
    schema::file_write
);
writer!(
    FileEditTool,
    "file_edit",
    Tier::T3,
    schema::FILE_EDIT,
    schema::file_edit
);
