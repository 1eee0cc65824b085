//! Requests an MCP server sends its client that the host answers: `sampling/createMessage`
//! (the server asks for a completion from the host's model) and `elicitation/create` (it asks
//! the user for input). A server may send them only when the client declared them at
//! `initialize`, so correx declares exactly the methods a registered [`McpRequestHandler`]
//! answers, and refuses (JSON-RPC -32601) any other.
//!
//! Each request is answered on a thread of its own (the server's output goes on being read,
//! so its progress, its other answers and a cancel still arrive), at most
//! [`MAX_IN_FLIGHT`] at a time per server. The handler's [`CancelToken`] fires when the server
//! withdraws the request (`notifications/cancelled`) or ends, or the runtime closes; closing
//! waits for handlers in progress to return.

use crate::cancel::CancelToken;
use parking_lot::RwLock;
use serde_json::Value;
use std::sync::Arc;

/// Host-answered requests one server may have in progress; more are refused (-32603).
pub(crate) const MAX_IN_FLIGHT: usize = 4;

/// A request an MCP server may send its client that only the host can answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum McpClientMethod {
    /// `sampling/createMessage`: the server asks for a completion. Answer with a
    /// `CreateMessageResult` (`{"role":"assistant","content":{"type":"text","text":..},
    /// "model":..,"stopReason":..}`).
    Sampling,
    /// `elicitation/create`: the server asks the user for input matching its
    /// `requestedSchema`. Answer with an `ElicitResult` (`{"action":"accept","content":{..}}`,
    /// or `"decline"` / `"cancel"`).
    Elicitation,
}

impl McpClientMethod {
    /// Every method a host can answer.
    pub const ALL: [McpClientMethod; 2] = [McpClientMethod::Sampling, McpClientMethod::Elicitation];

    /// The JSON-RPC method name.
    pub fn method(self) -> &'static str {
        match self {
            McpClientMethod::Sampling => "sampling/createMessage",
            McpClientMethod::Elicitation => "elicitation/create",
        }
    }

    /// The client capability that tells a server it may send it.
    pub fn capability(self) -> &'static str {
        match self {
            McpClientMethod::Sampling => "sampling",
            McpClientMethod::Elicitation => "elicitation",
        }
    }

    /// The method named `name`, if a host can answer it.
    pub fn from_method(name: &str) -> Option<McpClientMethod> {
        McpClientMethod::ALL
            .into_iter()
            .find(|m| m.method() == name)
    }
}

/// A request from a server, as its handler sees it.
#[derive(Debug)]
pub struct McpServerRequest<'a> {
    /// The server's name in the config (`mcp_servers`).
    pub server: &'a str,
    /// What it asks for.
    pub method: McpClientMethod,
    /// The request's `params`, as the server sent them (unchecked: the handler reads what it
    /// needs and refuses what it cannot use).
    pub params: &'a Value,
}

/// A refusal sent back to the server as a JSON-RPC error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpRefusal {
    /// The JSON-RPC error code; -1 is what the protocol's examples use for a user's
    /// rejection.
    pub code: i64,
    /// Said to the server.
    pub message: String,
}

impl McpRefusal {
    /// The user (or the host on their behalf) declined: code -1.
    pub fn declined(message: impl Into<String>) -> McpRefusal {
        McpRefusal {
            code: -1,
            message: message.into(),
        }
    }
}

/// Answers requests MCP servers send their client. Register one with
/// [`crate::McpHub::set_request_handler`]; it is shared by every server of the runtime.
pub trait McpRequestHandler: Send + Sync {
    /// The methods it answers; declared to each server it starts. Asked once, when the
    /// handler is registered (register it again to change them).
    fn methods(&self) -> Vec<McpClientMethod>;

    /// Answers `request` with its result object, or refuses it. Runs on a thread of its own
    /// with no correx lock held, so it may block (to ask a person, or to run the host's
    /// model); `cancel` fires when the server withdraws the request or stops, or the runtime
    /// closes (which waits for this call to return, so it must not close the runtime itself).
    /// An answer that is not a JSON object is sent as an error (-32603) instead; a panic
    /// too.
    ///
    /// # Errors
    /// The refusal sent to the server.
    fn handle(
        &self,
        request: &McpServerRequest<'_>,
        cancel: &CancelToken,
    ) -> Result<Value, McpRefusal>;
}

/// A registered handler and the methods it answers (asked once, sorted, without repeats).
struct Registered {
    handler: Arc<dyn McpRequestHandler>,
    methods: Vec<McpClientMethod>,
}

/// The runtime's handler, if one is registered: shared by its servers, looked up for each
/// request.
#[derive(Clone, Default)]
pub(crate) struct HandlerSlot(Arc<RwLock<Option<Registered>>>);

impl HandlerSlot {
    pub fn set(&self, handler: Option<Arc<dyn McpRequestHandler>>) {
        let registered = handler.map(|handler| {
            let mut methods = handler.methods();
            methods.sort();
            methods.dedup();
            Registered { handler, methods }
        });
        // The old one is dropped outside the lock (a host destructor may run).
        let old = std::mem::replace(&mut *self.0.write(), registered);
        drop(old);
    }

    /// The registered handler, if it answers `method`.
    pub fn answering(&self, method: McpClientMethod) -> Option<Arc<dyn McpRequestHandler>> {
        let slot = self.0.read();
        let r = slot.as_ref()?;
        r.methods.contains(&method).then(|| r.handler.clone())
    }

    /// The methods the registered handler answers, sorted, without repeats.
    pub fn methods(&self) -> Vec<McpClientMethod> {
        self.0
            .read()
            .as_ref()
            .map(|r| r.methods.clone())
            .unwrap_or_default()
    }
}

/// An elicitation's answer with the defaults of the fields it left out: a form's
/// `requestedSchema` may give each property a `default`, which the user saw pre-filled, so an
/// accepted answer that omits one means it (SEP-1034). Other answers are left as they are.
pub(crate) fn with_defaults(params: &Value, mut answer: Value) -> Value {
    if answer["action"] != "accept" {
        return answer;
    }
    let Some(properties) = params["requestedSchema"]["properties"].as_object() else {
        return answer;
    };
    if answer.get("content").is_none_or(Value::is_null) {
        answer["content"] = Value::Object(serde_json::Map::new());
    }
    if let Some(content) = answer["content"].as_object_mut() {
        for (field, schema) in properties {
            if let Some(default) = schema.get("default") {
                if !content.contains_key(field) {
                    content.insert(field.clone(), default.clone());
                }
            }
        }
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_accepted_elicitation_gets_the_defaults_of_what_it_left_out() {
        let params = json!({"requestedSchema": {"type": "object", "properties": {
            "name": {"type": "string", "default": "Ada"},
            "age": {"type": "integer", "default": 36},
            "note": {"type": "string"}
        }}});
        let answer = with_defaults(&params, json!({"action": "accept", "content": {"age": 28}}));
        assert_eq!(answer["content"], json!({"name": "Ada", "age": 28}));
        let answer = with_defaults(&params, json!({"action": "accept"}));
        assert_eq!(answer["content"], json!({"name": "Ada", "age": 36}));
        let declined = json!({"action": "decline"});
        assert_eq!(with_defaults(&params, declined.clone()), declined);
    }
}
