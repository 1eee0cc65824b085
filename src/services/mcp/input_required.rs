//! A result that asks for input before it can complete (2026-07-28's `InputRequiredResult`):
//! where older revisions had the server send its own requests (elicitation, sampling, roots),
//! the stateless revision answers `resultType: "input_required"` with the requests it needs
//! (`inputRequests`, by key) and an opaque `requestState`. The client answers each one as it
//! would the server's own request, and sends the original request again, under a new id,
//! with `inputResponses` (by the same keys) and the `requestState` exactly as given (none
//! when none was given).

use super::connection::{RpcError, Shared};
use super::host_requests::McpClientMethod;
use crate::cancel::CancelToken;
use serde_json::{Map, Value};

/// Rounds of input one request may ask for before it fails.
pub(crate) const MAX_ROUNDS: usize = 8;
/// Input requests one round may carry, at most.
const MAX_REQUESTS: usize = 16;

/// Whether `result` asks for input (a result without `resultType` is complete).
pub(crate) fn is_asked(result: &Value) -> bool {
    result.get("resultType").and_then(Value::as_str) == Some("input_required")
}

/// The answers to the input `asked` names, by its keys: `roots/list` answered here, a
/// method the host declared by its handler.
///
/// # Errors
/// Input that cannot be given: a malformed request, a method this client does not answer,
/// a refusal of the host's, or a cancel.
pub(crate) fn answers(
    shared: &Shared,
    asked: &Value,
    cancel: Option<&CancelToken>,
) -> Result<Map<String, Value>, RpcError> {
    let bad = |why: String| RpcError::Server {
        code: -32602,
        message: format!("the server asked for input this client cannot give: {why}"),
    };
    let Some(requests) = asked.get("inputRequests").and_then(Value::as_object) else {
        return Err(bad("no inputRequests object".into()));
    };
    if requests.is_empty() || requests.len() > MAX_REQUESTS {
        return Err(bad(format!(
            "{} input requests (1 to {MAX_REQUESTS} are answered)",
            requests.len()
        )));
    }
    let never = CancelToken::new();
    let cancel = cancel.unwrap_or(&never);
    let mut responses = Map::new();
    for (key, request) in requests {
        if cancel.is_cancelled() {
            return Err(RpcError::Cancelled);
        }
        let method = request.get("method").and_then(Value::as_str).unwrap_or("");
        let params = request.get("params").cloned().unwrap_or(Value::Null);
        let result = if method == "roots/list" {
            shared.roots_result()
        } else {
            let asked = McpClientMethod::from_method(method)
                .filter(|m| shared.declared.contains(m))
                .ok_or_else(|| {
                    bad(format!(
                        "{key:?} asks for {method:?}, which no handler answers"
                    ))
                })?;
            let reply = shared.answer_inline(asked, &params, cancel);
            // A cancel while the host answered is the caller's, not the server's error.
            if cancel.is_cancelled() {
                return Err(RpcError::Cancelled);
            }
            if shared.is_ended() {
                return Err(RpcError::Gone(shared.why_ended()));
            }
            match (reply.get("result"), reply.get("error")) {
                (Some(r), _) => r.clone(),
                (None, e) => {
                    let e = e.cloned().unwrap_or(Value::Null);
                    return Err(RpcError::Server {
                        code: e["code"].as_i64().unwrap_or(-32603),
                        message: format!(
                            "the host did not give the input {key:?} asks for: {}",
                            e["message"].as_str().unwrap_or("no reason given")
                        ),
                    });
                }
            }
        };
        responses.insert(key.clone(), result);
    }
    Ok(responses)
}

/// `params` made the retry of a request `asked` for input: the `responses`, and the
/// server's `requestState` exactly as it gave it (removed when it gave none).
pub(crate) fn retry_params(
    params: &mut Map<String, Value>,
    asked: &Value,
    responses: Map<String, Value>,
) {
    params.insert("inputResponses".into(), Value::Object(responses));
    match asked.get("requestState") {
        Some(state) if !state.is_null() => {
            params.insert("requestState".into(), state.clone());
        }
        _ => {
            params.remove("requestState");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_result_without_result_type_is_complete_and_state_is_echoed_or_omitted() {
        assert!(!is_asked(&json!({"content": []})));
        assert!(!is_asked(&json!({"resultType": "complete"})));
        assert!(is_asked(&json!({"resultType": "input_required"})));
        let mut params = Map::new();
        params.insert("name".into(), json!("t"));
        let asked = json!({"resultType": "input_required", "requestState": "opaque \"x\""});
        retry_params(&mut params, &asked, Map::new());
        assert_eq!(params["requestState"], json!("opaque \"x\""));
        // The next round gives no state: the old one is not sent again.
        retry_params(
            &mut params,
            &json!({"resultType": "input_required"}),
            Map::new(),
        );
        assert!(!params.contains_key("requestState"));
        assert_eq!(params["name"], json!("t"));
    }
}
