//! What each built-in tool takes, as a JSON schema: listed to hosts (`correx_tools_list`) and
//! usable as-is as a model's tool definition (a [`crate::ToolSpec`]'s `parameters`).

use super::Tier;
use serde::Serialize;
use serde_json::Value;

/// A tool as a host sees it in a listing.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolDescription {
    /// The registered name.
    pub name: String,
    /// The risk tier.
    pub tier: Tier,
    /// What it does, for a person or a model.
    pub description: String,
    /// The operations it takes in `"operation"`; empty for tools without one (the shell).
    pub operations: Vec<String>,
    /// A JSON schema of its parameters.
    pub parameters: Value,
    /// Whether the runtime's config enabled it.
    pub enabled: bool,
}

/// The operations a schema's `operation` property allows.
pub(crate) fn operations_of(schema: &Value) -> Vec<String> {
    schema["properties"]["operation"]["enum"]
        .as_array()
        .map(|ops| {
            ops.iter()
                .filter_map(|o| o.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
