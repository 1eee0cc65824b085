//! Long-lived services: what lives across tool calls and writes the log as it goes. Background
//! jobs ([`jobs`]: the job table a shell request with `"background": true` starts into) and MCP
//! servers ([`mcp`]: each a confined, supervised server whose tools join the registry).

pub(crate) mod jobs;
pub(crate) mod mcp;
