//! Embeddings: what `embed` returns, and the OpenAI-shaped body llama-server answers with.

use super::InferenceError;
use serde_json::Value;

/// Where llama-server serves embeddings (OpenAI's shape, with usage).
pub(crate) const EMBEDDINGS_PATH: &str = "/v1/embeddings";

/// Most inputs one call takes: a larger batch is split by the caller.
pub(crate) const MAX_EMBED_INPUTS: usize = 1024;

/// One vector per input, in input order.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Embeddings {
    /// The model that computed them.
    pub model: String,
    /// One vector per input, in the order given.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens the server read for all inputs.
    pub prompt_tokens: u32,
    /// Wall time of the call, in milliseconds.
    pub latency_ms: u64,
}

/// Checks the inputs before anything is sent.
///
/// # Errors
/// [`InferenceError::InvalidInput`] for no inputs, too many, or an empty one.
pub(crate) fn check_inputs(inputs: &[String]) -> Result<(), InferenceError> {
    let bad = |detail: String| Err(InferenceError::InvalidInput { detail });
    if inputs.is_empty() {
        return bad("no inputs: give at least one text to embed".into());
    }
    if inputs.len() > MAX_EMBED_INPUTS {
        return bad(format!(
            "{} inputs, over the {MAX_EMBED_INPUTS} one call takes; split them",
            inputs.len()
        ));
    }
    if let Some(i) = inputs.iter().position(|s| s.is_empty()) {
        return bad(format!(
            "input {i} is empty; an empty text has no embedding"
        ));
    }
    Ok(())
}

/// The request body for `inputs`.
pub(crate) fn body(served: &str, inputs: &[String]) -> Value {
    serde_json::json!({"model": served, "input": inputs, "encoding_format": "float"})
}

fn malformed(detail: String, body: &Value) -> InferenceError {
    InferenceError::MalformedBody {
        detail,
        body_prefix: crate::text::prefix(&body.to_string(), 200).to_owned(),
    }
}

/// The vectors of an answer to [`body`] for `count` inputs: every index once, every vector of
/// one length, every number finite.
///
/// # Errors
/// [`InferenceError::MalformedBody`] naming what is wrong.
pub(crate) fn parse(
    value: &Value,
    count: usize,
    model: &str,
    latency_ms: u64,
) -> Result<Embeddings, InferenceError> {
    let data = value
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("no `data` array".into(), value))?;
    if data.len() != count {
        return Err(malformed(
            format!("{} vectors for {count} inputs", data.len()),
            value,
        ));
    }
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; count];
    for item in data {
        let index = item
            .get("index")
            .and_then(Value::as_u64)
            .and_then(|i| usize::try_from(i).ok())
            .filter(|i| *i < count)
            .ok_or_else(|| malformed("an item without a valid `index`".into(), value))?;
        let numbers = item
            .get("embedding")
            .and_then(Value::as_array)
            .ok_or_else(|| malformed(format!("item {index} has no `embedding` array"), value))?;
        let vector = numbers
            .iter()
            .map(|n| n.as_f64().map(|x| x as f32).filter(|x| x.is_finite()))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| malformed(format!("item {index} holds a non-number"), value))?;
        if vector.is_empty() {
            return Err(malformed(format!("item {index} is an empty vector"), value));
        }
        if vectors[index].replace(vector).is_some() {
            return Err(malformed(format!("index {index} twice"), value));
        }
    }
    let vectors: Vec<Vec<f32>> = vectors.into_iter().flatten().collect();
    if vectors.iter().any(|v| v.len() != vectors[0].len()) {
        return Err(malformed("vectors of different lengths".into(), value));
    }
    let prompt_tokens = value
        .pointer("/usage/prompt_tokens")
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0);
    Ok(Embeddings {
        model: model.to_owned(),
        vectors,
        prompt_tokens,
        latency_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn vectors_come_back_in_input_order_and_bad_answers_are_named() {
        let v = json!({"data": [
            {"index": 1, "embedding": [3.0, 4.0]},
            {"index": 0, "embedding": [1.0, 2.0]}
        ], "usage": {"prompt_tokens": 7}});
        let e = parse(&v, 2, "m", 5).unwrap();
        assert_eq!(e.vectors, vec![vec![1.0, 2.0], vec![3.0, 4.0]]);
        assert_eq!(e.prompt_tokens, 7);
        for (bad, says) in [
            (json!({}), "no `data`"),
            (
                json!({"data": [{"index": 0, "embedding": [1.0]}]}),
                "1 vectors for 2",
            ),
            (
                json!({"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}]}),
                "index 0 twice",
            ),
            (
                json!({"data": [{"index": 0, "embedding": [1.0]}, {"index": 5, "embedding": [1.0]}]}),
                "valid `index`",
            ),
            (
                json!({"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0, 2.0]}]}),
                "different lengths",
            ),
            (
                json!({"data": [{"index": 0, "embedding": ["x"]}, {"index": 1, "embedding": [1.0]}]}),
                "non-number",
            ),
            (
                json!({"data": [{"index": 0, "embedding": {}}, {"index": 1, "embedding": [1.0]}]}),
                "no `embedding` array",
            ),
        ] {
            let e = parse(&bad, 2, "m", 0).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn inputs_are_checked_before_sending() {
        assert!(check_inputs(&[]).is_err());
        assert!(check_inputs(&["a".into(), String::new()])
            .unwrap_err()
            .to_string()
            .contains("input 1 is empty"));
        assert!(check_inputs(&vec!["a".to_owned(); MAX_EMBED_INPUTS + 1]).is_err());
        assert!(check_inputs(&["a".into()]).is_ok());
    }
}
