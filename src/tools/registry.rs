use super::{Tool, ToolError, ToolExecutor, ToolRequest, ToolResult, ToolRow, BUILTIN_TOOLS};
use crate::tools::Recoverable;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Tools a long-lived service offers beside the registry's own, found by name when asked for
/// (an MCP hub: `<server>.<tool>`, its server started on first use).
pub trait ToolSource: Send + Sync {
    /// The tool named `name`, if this source has it.
    fn resolve(&self, name: &str) -> Option<Arc<dyn Tool>>;
    /// Every tool it has (an MCP hub starts its servers to list them), and a disabled entry
    /// for each part that cannot be listed, saying why.
    fn describe(&self) -> Vec<super::ToolDescription>;
    /// The prefixes of its tools' names (an MCP server's name), listed as `<prefix>.*`.
    fn prefixes(&self) -> Vec<&str>;
}

/// The tools a runtime offers, fixed when built: there is no way to add one afterwards.
#[derive(Clone)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    /// The table whose disabled rows a listing shows too.
    table: Vec<ToolRow>,
    /// MCP servers, whose tools (`<server>.<tool>`) are listed by their servers.
    mcp: Option<Arc<dyn ToolSource>>,
}

impl Default for ToolRegistry {
    fn default() -> Self {
        ToolRegistry {
            tools: BTreeMap::new(),
            table: BUILTIN_TOOLS.to_vec(),
            mcp: None,
        }
    }
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// Builds a registry from `tools`.
    ///
    /// # Errors
    /// [`ToolError::DuplicateTool`] when two tools share a name.
    pub fn build(tools: Vec<Arc<dyn Tool>>) -> Result<Self, ToolError> {
        let mut map = BTreeMap::new();
        for t in tools {
            let name = t.name().to_owned();
            if map.insert(name.clone(), t).is_some() {
                return Err(ToolError::DuplicateTool { name });
            }
        }
        Ok(ToolRegistry {
            tools: map,
            table: BUILTIN_TOOLS.to_vec(),
            mcp: None,
        })
    }

    /// The same tools, listed with the rows of `table` they leave disabled (the built-in
    /// table unless set).
    pub(crate) fn listing(mut self, table: Vec<ToolRow>) -> Self {
        self.table = table;
        self
    }

    /// The same tools, and those of `hub` (the runtime's MCP servers).
    pub fn with_mcp(mut self, hub: Arc<dyn ToolSource>) -> Self {
        self.mcp = Some(hub);
        self
    }

    /// The tool with this name: a built-in (or host) tool, or `<server>.<tool>` of an MCP
    /// server (started if it is not running).
    pub fn resolve(&self, name: &str) -> Option<Arc<dyn Tool>> {
        match self.tools.get(name) {
            Some(t) => Some(t.clone()),
            None => self.mcp.as_ref()?.resolve(name),
        }
    }

    /// Every tool, ordered by name.
    pub fn all(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.values().cloned().collect()
    }

    /// Every tool here (enabled), and the rows of its table that are not (disabled), by name.
    pub fn describe(&self) -> Vec<super::ToolDescription> {
        let mut out: Vec<super::ToolDescription> = self
            .all()
            .iter()
            .map(|t| {
                let parameters = t.parameters();
                super::ToolDescription {
                    name: t.name().to_owned(),
                    tier: t.tier(),
                    description: t.description().to_owned(),
                    operations: super::describe::operations_of(&parameters),
                    parameters,
                    enabled: true,
                }
            })
            .collect();
        for row in &self.table {
            if self.resolve(row.name).is_none() {
                let parameters = (row.parameters)();
                out.push(super::ToolDescription {
                    name: row.name.to_owned(),
                    tier: row.tier,
                    description: row.description.to_owned(),
                    operations: super::describe::operations_of(&parameters),
                    parameters,
                    enabled: false,
                });
            }
        }
        if let Some(hub) = &self.mcp {
            out.extend(hub.describe());
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Every tool name, ordered (an MCP server's tools as `<server>.*`).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tools.keys().cloned().collect();
        if let Some(hub) = &self.mcp {
            names.extend(hub.prefixes().into_iter().map(|s| format!("{s}.*")));
        }
        names
    }
}

/// Runs each request with the registry's tool of that name.
#[derive(Clone, Debug)]
pub struct DispatchingToolExecutor {
    registry: ToolRegistry,
}

impl DispatchingToolExecutor {
    /// Dispatches through `registry`.
    pub fn new(registry: ToolRegistry) -> Self {
        DispatchingToolExecutor { registry }
    }
}

impl ToolExecutor for DispatchingToolExecutor {
    fn execute(&self, request: &ToolRequest) -> ToolResult {
        self.execute_cancellable(request, &crate::cancel::CancelToken::new())
    }

    fn execute_cancellable(
        &self,
        request: &ToolRequest,
        cancel: &crate::cancel::CancelToken,
    ) -> ToolResult {
        match self.registry.resolve(&request.tool_name) {
            Some(tool) => tool.execute_cancellable(request, cancel),
            None => ToolResult::failure_of(
                &request.invocation_id,
                crate::tools::ToolErrorKind::InvalidRequest,
                format!(
                    "unknown tool {:?}; available: {}",
                    request.tool_name,
                    self.registry.names().join(", ")
                ),
                Recoverable::No,
            ),
        }
    }
}
