//! What the file tools say of themselves: their descriptions and parameter schemas, as
//! listed to hosts and usable as a model's tool definitions.

use serde_json::{json, Value};

fn path_property() -> Value {
    json!({
        "type": "string",
        "description": "a path relative to the first allowed root, or an absolute path inside an allowed root"
    })
}

/// `file_read`'s description.
pub(crate) const FILE_READ: &str =
    "reads a text file, lists a directory, or says whether a path exists, inside the allowed roots";
/// `file_write`'s description.
pub(crate) const FILE_WRITE: &str =
    "writes a whole file atomically, or deletes one, inside the allowed roots";
/// `file_edit`'s description.
pub(crate) const FILE_EDIT: &str = "appends to a file, replaces one exact occurrence of a text, or applies a unified diff, inside the allowed roots";

/// `file_read`'s parameters.
pub(crate) fn file_read() -> Value {
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

/// `file_write`'s parameters.
pub(crate) fn file_write() -> Value {
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

/// `file_edit`'s parameters.
pub(crate) fn file_edit() -> Value {
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
