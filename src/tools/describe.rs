//! What each built-in tool takes, as a JSON schema: listed to hosts (`correx_tools_list`) and
//! usable as-is as a model's tool definition (a [`crate::ToolSpec`]'s `parameters`).

use super::Tier;
use serde::Serialize;
use serde_json::{json, Value};

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

fn path_property() -> Value {
    json!({
        "type": "string",
        "description": "a path relative to the first allowed root, or an absolute path inside an allowed root"
    })
}

pub(crate) const FILE_READ: &str =
    "reads a text file, lists a directory, or says whether a path exists, inside the allowed roots";
pub(crate) const FILE_WRITE: &str =
    "writes a whole file atomically, or deletes one, inside the allowed roots";
pub(crate) const FILE_EDIT: &str = "appends to a file, replaces one exact occurrence of a text, or applies a unified diff, inside the allowed roots";
pub(crate) const SHELL: &str =
    "runs an allowlisted executable with an argument vector (no shell syntax), confined by the kernel";

pub(crate) fn file_read_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "operation": {"type": "string", "enum": ["read", "list", "exists"]},
            "path": path_property()
        },
        "required": ["operation", "path"],
        "additionalProperties": false
    })
}

pub(crate) fn file_write_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "operation": {"type": "string", "enum": ["write", "delete"]},
            "path": path_property(),
            "content": {"type": "string", "description": "the whole new content (write)"}
        },
        "required": ["operation", "path"],
        "additionalProperties": false
    })
}

pub(crate) fn file_edit_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "operation": {"type": "string", "enum": ["append", "replace", "patch"]},
            "path": path_property(),
            "content": {"type": "string", "description": "the text to add at the end (append)"},
            "target": {"type": "string", "description": "the exact text to replace, found exactly once (replace)"},
            "replacement": {"type": "string", "description": "what replaces it (replace)"},
            "patch": {"type": "string", "description": "a unified diff whose paths are inside the allowed roots (patch)"}
        },
        "required": ["operation"],
        "additionalProperties": false
    })
}

pub(crate) fn shell_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "argv": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "description": "the executable (allowlisted) and its arguments"
            },
            "cwd": {"type": "string", "description": "the start directory, inside a working root"}
        },
        "required": ["argv"],
        "additionalProperties": false
    })
}

/// The built-in tools, for listing those the config left disabled.
pub(crate) fn builtins() -> Vec<ToolDescription> {
    [
        ("file_read", Tier::T1, FILE_READ, file_read_schema()),
        ("file_write", Tier::T2, FILE_WRITE, file_write_schema()),
        ("file_edit", Tier::T3, FILE_EDIT, file_edit_schema()),
        ("shell", Tier::T2, SHELL, shell_schema()),
    ]
    .into_iter()
    .map(|(name, tier, description, parameters)| ToolDescription {
        name: name.to_owned(),
        tier,
        description: description.to_owned(),
        operations: operations_of(&parameters),
        parameters,
        enabled: false,
    })
    .collect()
}
