//! Reading tool parameters with failures a model can act on.

use super::{ToolRequest, ToolResult};
use crate::tools::Recoverable;

/// A required string parameter.
pub(crate) fn required_str<'a>(req: &'a ToolRequest, name: &str) -> Result<&'a str, ToolResult> {
    match req.parameters.get(name) {
        Some(serde_json::Value::String(s)) => Ok(s),
        Some(other) => Err(ToolResult::failure_of(
            &req.invocation_id,
            crate::tools::ToolErrorKind::InvalidRequest,
            format!(
                "parameter {name:?} must be a string, got {}",
                json_kind(other)
            ),
            Recoverable::Yes,
        )),
        None => Err(ToolResult::failure_of(
            &req.invocation_id,
            crate::tools::ToolErrorKind::InvalidRequest,
            format!("missing required parameter {name:?}"),
            Recoverable::Yes,
        )),
    }
}

/// An optional string parameter.
pub(crate) fn optional_str<'a>(
    req: &'a ToolRequest,
    name: &str,
) -> Result<Option<&'a str>, ToolResult> {
    match req.parameters.get(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(_) => required_str(req, name).map(Some),
    }
}

pub(crate) fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
