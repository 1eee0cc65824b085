//! `correx mcp pin DB SERVER [TOOL...]`: pins the tool definitions an MCP server's listing
//! changed (held since, `mcp.tool_held`), so a runtime on the log uses them from their next
//! call.

use crate::args::Args;
use crate::log::open;
use crate::style::line;
use crate::Failure;

/// Most tools named on one command line.
const MAX_TOOLS: usize = 256;

pub fn pin(args: Args) -> Result<(), Failure> {
    let optional = vec!["TOOL"; MAX_TOOLS];
    let words = args.positionals_between(&["DB", "SERVER"], &optional)?;
    let (db, server, tools) = (words[0], words[1], &words[2..]);
    let store = open(db)?;
    let pinned = correx::pin_held_tools(store.as_ref(), server, tools)
        .map_err(|e| Failure::Run(e.to_string()))?;
    if pinned.is_empty() {
        return Err(Failure::Run(format!(
            "nothing of mcp server {server} is held{}",
            if tools.is_empty() {
                String::new()
            } else {
                format!(" among {}", tools.join(", "))
            }
        )));
    }
    for (tool, digest) in &pinned {
        line(&format!("{server}.{tool}\tpinned\t{digest}"));
    }
    Ok(())
}
