//! Pinning the held tool definitions of an MCP server (see docs/mcp.md, "Tool definitions
//! pinned").

use super::convert::request_arg;
use super::runtime::{answer_json, correx_runtime};
use super::{correx_error, Failure, FfiResult, CORREX_E_EVENT_STORE, CORREX_E_NOT_FOUND};
use serde_json::{json, Value};
use std::ffi::c_char;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PinIn {
    server: String,
    #[serde(default)]
    tools: Vec<String>,
}

/// Pins what is held of MCP server `server`: each tool whose definition changed since it was
/// pinned (recorded `mcp.tool_held`) and that no later pin covers, or only those of `tools`.
/// Each is recorded pinned by the `host` (`mcp.tools_pinned`) and used from its next call, by
/// this runtime and any other on the log.
///
/// # Parameters
/// - `request_json`: `{"v": 1, "server": "a server of the config's mcp_servers", "tools":
///   ["a tool's name without its server's prefix", ...] (optional; none: every held tool)}`.
/// - `out_json`: receives `{"v": 1, "pinned": {"tool": "sha256:digest", ...}}`, empty when
///   nothing was held.
///
/// # Returns
/// `CORREX_OK`; `CORREX_E_NOT_FOUND` when the config has no such server;
/// `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_EVENT_STORE`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
///
/// # Memory and lifetimes
/// `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
///
/// # Blocking and threads
/// Reads the log's `mcp-pins` stream and appends at most one event; starts no server. Any
/// thread.
///
/// # Safety
/// Pointers are NULL or valid as documented.
#[no_mangle]
pub unsafe extern "C" fn correx_mcp_pin(
    rt: *const correx_runtime,
    request_json: *const c_char,
    out_json: *mut *mut c_char,
    err: *mut *mut correx_error,
) -> i32 {
    let body = |r: &correx_runtime| -> FfiResult<Value> {
        // SAFETY: the contract above says this is NULL or a valid C string.
        let input: PinIn = unsafe { request_arg(request_json, "request_json") }?;
        let hub = r.runtime.mcp();
        if !hub.names().contains(&input.server.as_str()) {
            return Err(Failure::new(
                CORREX_E_NOT_FOUND,
                format!("no MCP server {:?} in the config", input.server),
            ));
        }
        let tools: Vec<&str> = input.tools.iter().map(String::as_str).collect();
        let pinned = hub
            .pin_tools(&input.server, &tools)
            .map_err(|e| Failure::new(CORREX_E_EVENT_STORE, e.to_string()))?;
        Ok(json!({ "pinned": pinned }))
    };
    // SAFETY: rt, out_json and err are NULL or valid, per this function's contract.
    unsafe { answer_json(rt, out_json, err, body) }
}
