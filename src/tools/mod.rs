//! Tools an agent may run: the contracts, the registry, and the built-in tools.

mod contract;

pub use contract::{
    FileAffectingTool, Tier, Tool, ToolCapability, ToolExecutor, ToolRequest, ToolResult,
    ValidationResult,
};
