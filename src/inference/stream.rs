//! Reading a streamed chat answer: server-sent events (`data: {chunk}` lines ending with
//! `data: [DONE]`) assembled into the same [`InferenceResponse`] a non-streamed call returns.
//!
//! llama-server's last chunk before `[DONE]` carries `usage` and `timings` when the request
//! asks for `stream_options.include_usage`; a stream without it is
//! [`InferenceError::StreamIncomplete`], one that breaks off is
//! [`InferenceError::StreamInterrupted`].

use super::{
    ChunkKind, FinishReason, InferenceError, InferenceResponse, StreamChunk, StreamControl,
    TokenUsage, ToolCall,
};
use crate::cancel::CancelToken;
use serde_json::Value;
use std::io::{self, BufRead, Read};

/// Longest event line accepted (a chunk is a token or a few, plus its envelope).
const MAX_LINE: usize = 4 * 1024 * 1024;
/// How much of a bad line an error quotes.
const LINE_PREFIX: usize = 200;

fn prefix(text: &str, max: usize) -> String {
    crate::text::prefix(text, max).to_owned()
}

/// A tool call from its parts; arguments that are not JSON are kept as a JSON string.
pub(crate) fn tool_call(id: String, name: String, arguments: &str) -> ToolCall {
    let arguments = if arguments.trim().is_empty() {
        Value::Object(Default::default())
    } else {
        serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_owned()))
    };
    ToolCall {
        id,
        name,
        arguments,
    }
}

#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// The answer so far.
#[derive(Default)]
struct Assembly {
    text: String,
    reasoning: String,
    finish: Option<FinishReason>,
    usage: Option<TokenUsage>,
    timings: Option<Value>,
    model: Option<String>,
    calls: Vec<PartialCall>,
    events: u64,
    done: bool,
}

fn u32_of(v: &Value, key: &str) -> Option<u32> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|n| n.min(u64::from(u32::MAX)) as u32)
}

/// The usage object of a body or chunk.
pub(crate) fn usage_of(v: &Value) -> Option<TokenUsage> {
    Some(TokenUsage {
        prompt_tokens: u32_of(v, "prompt_tokens")?,
        completion_tokens: u32_of(v, "completion_tokens")?,
        total_tokens: u32_of(v, "total_tokens")?,
    })
}

fn malformed(detail: impl Into<String>, line: &str) -> InferenceError {
    InferenceError::MalformedEvent {
        detail: detail.into(),
        line_prefix: prefix(line, LINE_PREFIX),
    }
}

/// The error a server reported inside the stream (`{"error": {...}}`).
fn server_error(v: &Value) -> InferenceError {
    let status = v["error"]
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .unwrap_or(500);
    match super::llama::http_error(status, &v.to_string()) {
        InferenceError::Http { status, message } => InferenceError::Http {
            status,
            message: format!("during the stream: {message}"),
        },
        other => other,
    }
}

impl Assembly {
    /// Takes one `data:` payload; calls `on_chunk` for new text.
    fn take(
        &mut self,
        data: &str,
        on_chunk: &mut dyn FnMut(StreamChunk<'_>) -> StreamControl,
    ) -> Result<(), InferenceError> {
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let v: Value =
            serde_json::from_str(data).map_err(|e| malformed(format!("not JSON: {e}"), data))?;
        if !v.is_object() {
            return Err(malformed("an event is not a JSON object", data));
        }
        if v.get("error").is_some() {
            return Err(server_error(&v));
        }
        self.events += 1;
        if let Some(m) = v.get("model").and_then(Value::as_str) {
            self.model.get_or_insert_with(|| m.to_owned());
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(usage_of(u).ok_or_else(|| malformed("usage lacks counts", data))?);
        }
        if let Some(t) = v.get("timings").filter(|t| !t.is_null()) {
            self.timings = Some(t.clone());
        }
        let choices = match v.get("choices") {
            Some(Value::Array(c)) => c,
            None | Some(Value::Null) => return Ok(()),
            Some(_) => return Err(malformed("choices is not an array", data)),
        };
        let Some(choice) = choices.first() else {
            return Ok(());
        };
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(FinishReason::from_server(f));
        }
        let Some(delta) = choice.get("delta") else {
            return Ok(());
        };
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (n, call) in calls.iter().enumerate() {
                let index = call
                    .get("index")
                    .and_then(Value::as_u64)
                    .map_or(n, |i| i as usize);
                if index > self.calls.len() + 64 {
                    return Err(malformed("a tool call index jumps too far", data));
                }
                while self.calls.len() <= index {
                    self.calls.push(PartialCall::default());
                }
                let slot = &mut self.calls[index];
                if let Some(id) = call.get("id").and_then(Value::as_str) {
                    slot.id = id.to_owned();
                }
                let f = call.get("function");
                if let Some(name) = f.and_then(|f| f.get("name")).and_then(Value::as_str) {
                    slot.name.push_str(name);
                }
                if let Some(a) = f.and_then(|f| f.get("arguments")).and_then(Value::as_str) {
                    slot.arguments.push_str(a);
                }
            }
        }
        for (key, kind) in [
            ("reasoning_content", ChunkKind::Reasoning),
            ("content", ChunkKind::Text),
        ] {
            let Some(text) = delta.get(key).and_then(Value::as_str) else {
                continue;
            };
            if text.is_empty() {
                continue;
            }
            match kind {
                ChunkKind::Text => self.text.push_str(text),
                ChunkKind::Reasoning => self.reasoning.push_str(text),
            }
            if on_chunk(StreamChunk { kind, text }) == StreamControl::Stop {
                return Err(InferenceError::Cancelled);
            }
        }
        Ok(())
    }

    fn finish(
        self,
        latency_ms: u64,
        fallback_model: &str,
    ) -> Result<InferenceResponse, InferenceError> {
        let events = self.events;
        let finish = self
            .finish
            .ok_or_else(|| InferenceError::StreamIncomplete {
                detail: "no event carried a finish_reason".into(),
                events,
            })?;
        let usage = self.usage.ok_or_else(|| InferenceError::StreamIncomplete {
            detail: "no event carried usage".into(),
            events,
        })?;
        Ok(InferenceResponse {
            text: self.text,
            usage,
            finish_reason: finish,
            latency_ms,
            model: self.model.unwrap_or_else(|| fallback_model.to_owned()),
            timings: self.timings,
            tool_calls: self
                .calls
                .into_iter()
                .map(|c| tool_call(c.id, c.name, &c.arguments))
                .collect(),
            reasoning: (!self.reasoning.is_empty()).then_some(self.reasoning),
            endpoint: None,
        })
    }
}

/// What a failed read means, given whether the caller cancelled.
fn read_failure(e: &io::Error, cancel: &CancelToken, url: &str, events: u64) -> InferenceError {
    if cancel.is_cancelled() {
        return InferenceError::Cancelled;
    }
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => InferenceError::Timeout {
            url: url.to_owned(),
            detail: format!("no event for the read timeout: {e}"),
        },
        io::ErrorKind::InvalidData => InferenceError::MalformedEvent {
            detail: format!("the HTTP framing is broken: {e}"),
            line_prefix: String::new(),
        },
        _ => InferenceError::StreamInterrupted {
            url: url.to_owned(),
            events,
            detail: e.to_string(),
        },
    }
}

/// Reads an event stream to its end (or to `[DONE]`, then drains the body so the connection
/// can be reused) and assembles the answer.
///
/// # Errors
/// [`InferenceError::Cancelled`], the stream errors, a server error sent in the stream.
pub(crate) fn read_events(
    mut reader: impl BufRead,
    cancel: &CancelToken,
    on_chunk: &mut dyn FnMut(StreamChunk<'_>) -> StreamControl,
    url: &str,
    latency_from: std::time::Instant,
    fallback_model: &str,
) -> Result<InferenceResponse, InferenceError> {
    let mut a = Assembly::default();
    let mut line = Vec::new();
    let mut data = String::new();
    while !a.done {
        line.clear();
        let n = (&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| read_failure(&e, cancel, url, a.events))?;
        if cancel.is_cancelled() {
            return Err(InferenceError::Cancelled);
        }
        if n == 0 {
            break;
        }
        if n > MAX_LINE {
            return Err(malformed(
                "an event line is longer than 4 MiB",
                &String::from_utf8_lossy(&line),
            ));
        }
        let text = std::str::from_utf8(&line).map_err(|_| {
            malformed(
                "an event line is not UTF-8",
                &String::from_utf8_lossy(&line),
            )
        })?;
        let text = text.trim_end_matches(['\n', '\r']);
        if text.is_empty() {
            // A blank line ends an event: dispatch its data.
            if !data.is_empty() {
                a.take(&data, on_chunk)?;
                data.clear();
            }
            continue;
        }
        if text.starts_with(':') {
            continue;
        }
        let (field, value) = text.split_once(':').unwrap_or((text, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "data" => {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(value);
            }
            "error" => {
                let v: Value = serde_json::from_str(value)
                    .map_err(|_| malformed("an error event is not JSON", text))?;
                let v = if v.get("error").is_some() {
                    v
                } else {
                    serde_json::json!({ "error": v })
                };
                return Err(server_error(&v));
            }
            "event" | "id" | "retry" => {}
            _ => {
                return Err(malformed(
                    format!("unknown field {:?}", prefix(field, 40)),
                    text,
                ))
            }
        }
    }
    if !a.done && !data.is_empty() {
        // The body ended without the blank line after the last event.
        a.take(&data, on_chunk)?;
    }
    if a.done {
        // The terminating chunk follows at once; reading it returns the connection to the pool.
        let mut rest = Vec::new();
        if let Err(e) = (&mut reader).take(64 * 1024).read_to_end(&mut rest) {
            log::debug!("after [DONE]: {e}");
        }
    }
    let latency_ms = latency_from.elapsed().as_millis() as u64;
    a.finish(latency_ms, fallback_model)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn run(body: &str) -> (Result<InferenceResponse, InferenceError>, String) {
        let mut seen = String::new();
        let r = read_events(
            body.as_bytes(),
            &CancelToken::new(),
            &mut |c| {
                seen.push_str(c.text);
                StreamControl::Continue
            },
            "http://x",
            Instant::now(),
            "m",
        );
        (r, seen)
    }

    const TAIL: &str = "data: {\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"delta\":{}}]}\n\ndata: {\"choices\":[],\"usage\":{\"completion_tokens\":2,\"prompt_tokens\":5,\"total_tokens\":7},\"timings\":{\"predicted_n\":2}}\n\ndata: [DONE]\n\n";

    #[test]
    fn deltas_assemble_into_the_answer() {
        let body = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"role\":\"assistant\",\"content\":null}}}}],\"model\":\"g\"}}\n\n: a comment\n\ndata: {{\"choices\":[{{\"delta\":{{\"content\":\"Par\"}}}}]}}\n\ndata: {{\"choices\":[{{\"delta\":{{\"content\":\"is\"}}}}]}}\r\n\r\n{TAIL}"
        );
        let (r, seen) = run(&body);
        let r = r.unwrap();
        assert_eq!((r.text.as_str(), seen.as_str()), ("Paris", "Paris"));
        assert_eq!(r.finish_reason, FinishReason::Stop);
        assert_eq!(r.usage.total_tokens, 7);
        assert_eq!(r.model, "g");
        assert_eq!(r.timings.unwrap()["predicted_n"], 2);
    }

    #[test]
    fn tool_call_deltas_merge_by_index() {
        let body = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"tool_calls\":[{{\"index\":0,\"id\":\"c1\",\"type\":\"function\",\"function\":{{\"name\":\"get_weather\",\"arguments\":\"{{\\\"ci\"}}}}]}}}}]}}\n\ndata: {{\"choices\":[{{\"delta\":{{\"tool_calls\":[{{\"index\":0,\"function\":{{\"arguments\":\"ty\\\": \\\"Paris\\\"}}\"}}}}]}}}}]}}\n\n{}",
            TAIL.replace("\"stop\"", "\"tool_calls\"")
        );
        let r = run(&body).0.unwrap();
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.tool_calls[0].id, "c1");
        assert_eq!(r.tool_calls[0].name, "get_weather");
        assert_eq!(
            r.tool_calls[0].arguments,
            serde_json::json!({"city": "Paris"})
        );
    }

    #[test]
    fn broken_streams_are_told_apart() {
        let (r, _) =
            run("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n");
        assert!(
            matches!(r, Err(InferenceError::StreamIncomplete { events: 1, .. })),
            "{r:?}"
        );
        let (r, _) = run("data: {not json\n\n");
        assert!(
            matches!(r, Err(InferenceError::MalformedEvent { .. })),
            "{r:?}"
        );
        let (r, _) = run("bogus line\n\n");
        assert!(
            matches!(r, Err(InferenceError::MalformedEvent { .. })),
            "{r:?}"
        );
        let (r, _) = run("data: {\"error\":{\"code\":500,\"message\":\"slot died\"}}\n\n");
        match r {
            Err(e @ InferenceError::Http { status: 500, .. }) => {
                assert!(e.to_string().contains("slot died"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_stop_from_the_callback_is_a_cancel() {
        let body = format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"a\"}}}}]}}\n\n{TAIL}");
        let r = read_events(
            body.as_bytes(),
            &CancelToken::new(),
            &mut |_| StreamControl::Stop,
            "http://x",
            Instant::now(),
            "m",
        );
        assert!(matches!(r, Err(InferenceError::Cancelled)));
    }
}
