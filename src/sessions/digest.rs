//! The digest that ties a step's key to one request: SHA-256 of the request's JSON.
//!
//! serde_json writes a struct's fields in declaration order and an object's keys sorted, so
//! the same request gives the same bytes in every process of this build. A tool request's
//! digest leaves out its invocation id and session (fresh on every call) and keeps what the
//! tool is asked: its name, its parameters and the call id it answers.

use crate::inference::InferenceRequest;
use crate::text::hex;
use crate::tools::ToolRequest;
use serde_json::json;
use sha2::{Digest, Sha256};

/// `infer`, `tool` or `wait`: what a step does.
pub(super) const INFER: &str = "infer";
/// See [`INFER`].
pub(super) const TOOL: &str = "tool";
/// See [`INFER`].
pub(super) const WAIT: &str = "wait";

fn sha256(value: &serde_json::Value) -> String {
    // Serializing a Value cannot fail.
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    hex(&Sha256::digest(&bytes))
}

/// The digest of an inference step's request to the model `model` (so the same key asked of
/// another model is a conflict, not the first model's answer).
pub(super) fn of_inference(model: &str, request: &InferenceRequest) -> String {
    sha256(&json!({"kind": INFER, "model": model, "request": request}))
}

/// The digest earlier versions gave an inference step: the request alone. A step recorded
/// with it still answers (which model answered it is not in its digest).
pub(super) fn of_inference_without_model(request: &InferenceRequest) -> String {
    sha256(&json!({"kind": INFER, "request": request}))
}

/// The digest of a wait step for signal `name`.
pub(super) fn of_wait(name: &str) -> String {
    sha256(&json!({"kind": WAIT, "name": name}))
}

/// The digest of a tool step's request.
pub(super) fn of_tool(request: &ToolRequest, call_id: Option<&str>) -> String {
    sha256(&json!({
        "kind": TOOL,
        "tool": request.tool_name,
        "parameters": request.parameters,
        "call_id": call_id,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_digest_ignores_the_fresh_ids_and_sees_every_argument() {
        let a = ToolRequest::json("s", "shell", json!({"argv": ["ls"]})).unwrap();
        let b = ToolRequest::json("s", "shell", json!({"argv": ["ls"]})).unwrap();
        assert_ne!(a.invocation_id, b.invocation_id);
        assert_eq!(of_tool(&a, Some("c1")), of_tool(&b, Some("c1")));
        assert_ne!(of_tool(&a, Some("c1")), of_tool(&a, Some("c2")));
        let c = ToolRequest::json("s", "shell", json!({"argv": ["ls", "-l"]})).unwrap();
        assert_ne!(of_tool(&a, None), of_tool(&c, None));
        assert_eq!(of_tool(&a, None).len(), 64);
    }

    #[test]
    fn an_inference_digest_sees_the_model_the_context_and_the_sampling() {
        let mut r = InferenceRequest::default();
        let d = of_inference("m", &r);
        assert_eq!(d, of_inference("m", &r.clone()));
        assert_ne!(d, of_inference("n", &r));
        assert_ne!(d, of_inference_without_model(&r));
        r.context.task = Some("hi".into());
        assert_ne!(d, of_inference("m", &r));
        let d = of_inference("m", &r);
        r.config.seed = Some(7);
        assert_ne!(d, of_inference("m", &r));
    }
}
