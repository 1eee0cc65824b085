//! Streaming, cancellation that reaches the server, structured output and tool calls, against
//! a real llama-server; the stubs only send what a real server will not (a malformed event, a
//! stream without its final event).

use crate::inference::ask;
use crate::stub::{sse, StubServer};
use crate::util::{llama_install, raw_http, TestServer};
use correx::{
    chat_body, CancelToken, ChunkKind, ContextEntry, FinishReason, HttpOptions, InferenceError,
    InferenceProvider, JsonSchemaFormat, LlamaCppInferenceProvider, ResponseFormat, SourceType,
    StreamControl, ToolCall, ToolChoice, ToolSpec,
};
use serde_json::{json, Value};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One slot, so a generation left running would hold up the next request; metrics on.
const ONE_SLOT: &[&str] = &[
    "--no-jinja",
    "--chat-template",
    "gemma",
    "--parallel",
    "1",
    "--metrics",
];

fn metric(port: u16, name: &str) -> Result<f64, Box<dyn std::error::Error>> {
    let (_, body) = raw_http(port, "GET", "/metrics", "")?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .ok_or_else(|| format!("no {name} in /metrics").into())
}

fn slot_busy(port: u16) -> Result<bool, Box<dyn std::error::Error>> {
    let (_, body) = raw_http(port, "GET", "/slots", "")?;
    let slots: Value = serde_json::from_str(&body)?;
    Ok(slots[0]["is_processing"].as_bool() == Some(true))
}

/// Waits for the server's only slot to go idle; the decode count then.
fn wait_idle(port: u16) -> Result<f64, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while slot_busy(port)? {
        if Instant::now() > deadline {
            return Err("the slot kept decoding after the cancel".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    metric(port, "llamacpp:n_decode_total")
}

#[test]
fn streamed_and_plain_answers_are_identical_at_temperature_zero() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let server = TestServer::start(&install);
    let p = LlamaCppInferenceProvider::new("gemma", &server.base_url(), &HttpOptions::default());
    let req = ask("Name three colors.", 24);
    let mut pieces = Vec::new();
    let streamed = p.infer_stream(&req, &CancelToken::new(), &mut |c| {
        assert_eq!(c.kind, ChunkKind::Text);
        pieces.push(c.text.to_owned());
        StreamControl::Continue
    })?;
    // The same body without streaming, sent by a bare client.
    let (status, plain) = raw_http(
        server.port,
        "POST",
        "/v1/chat/completions",
        &chat_body("gemma", &req).to_string(),
    )?;
    assert_eq!(status, 200);
    let plain: Value = serde_json::from_str(&plain)?;
    assert_eq!(
        streamed.text,
        plain["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("?")
    );
    assert_eq!(
        serde_json::to_value(streamed.usage)?,
        json!({
            "prompt_tokens": plain["usage"]["prompt_tokens"],
            "completion_tokens": plain["usage"]["completion_tokens"],
            "total_tokens": plain["usage"]["total_tokens"],
        })
    );
    assert!(pieces.len() > 3, "the answer arrived in pieces: {pieces:?}");
    assert_eq!(pieces.concat(), streamed.text);
    assert!(
        streamed.timings.is_some(),
        "the last event carries the timings"
    );
    assert_eq!(
        streamed.finish_reason.as_str(),
        plain["choices"][0]["finish_reason"]
    );
    Ok(())
}

#[test]
fn a_cancel_closes_the_connection_and_the_server_stops_decoding() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let server = TestServer::start_with(&install, ONE_SLOT);
    let p = Arc::new(LlamaCppInferenceProvider::new(
        "gemma",
        &server.base_url(),
        &HttpOptions::default(),
    ));
    let token = CancelToken::new();
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn({
        let (p, token) = (Arc::clone(&p), token.clone());
        move || {
            let mut n = 0;
            p.infer_stream(
                &ask("Write a very long story about a lighthouse keeper.", 4000),
                &token,
                &mut |_| {
                    n += 1;
                    if n == 5 {
                        let _ = tx.send(());
                    }
                    StreamControl::Continue
                },
            )
        }
    });
    rx.recv_timeout(Duration::from_secs(60))?;
    assert!(
        slot_busy(server.port)?,
        "the slot decodes while the answer streams"
    );
    token.cancel();
    let result = worker.join().map_err(|_| "the streaming thread panicked")?;
    assert!(
        matches!(result, Err(InferenceError::Cancelled)),
        "{result:?}"
    );
    let decoded = wait_idle(server.port)?;
    std::thread::sleep(Duration::from_millis(300));
    assert!(!slot_busy(server.port)?);
    assert_eq!(
        metric(server.port, "llamacpp:n_decode_total")?,
        decoded,
        "the decode count stopped growing"
    );
    assert!(
        decoded < 400.0,
        "stopped long before max_tokens: {decoded} decodes"
    );
    // One slot: had the abandoned answer kept going (4000 tokens, about a minute here), this
    // request would wait behind it and run into its 10 s read timeout.
    let quick = LlamaCppInferenceProvider::new(
        "gemma",
        &server.base_url(),
        &HttpOptions {
            read_timeout: Duration::from_secs(10),
            ..HttpOptions::default()
        },
    );
    let next = quick.infer(&ask("What is the capital of France?", 8))?;
    assert!(next.usage.completion_tokens > 0);
    // The token still cancels a call that starts after the cancel, before it connects.
    assert!(matches!(
        p.infer_with_cancel(&ask("x", 4), &token),
        Err(InferenceError::Cancelled)
    ));
    Ok(())
}

#[test]
fn a_callback_stop_ends_the_generation_on_the_server() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let server = TestServer::start_with(&install, ONE_SLOT);
    let p = LlamaCppInferenceProvider::new("gemma", &server.base_url(), &HttpOptions::default());
    let mut seen = String::new();
    let r = p.infer_stream(
        &ask("Write a very long story about a dragon.", 4000),
        &CancelToken::new(),
        &mut |c| {
            seen.push_str(c.text);
            if seen.len() > 20 {
                StreamControl::Stop
            } else {
                StreamControl::Continue
            }
        },
    );
    assert!(matches!(r, Err(InferenceError::Cancelled)), "{r:?}");
    assert!(!seen.is_empty());
    let decoded = wait_idle(server.port)?;
    assert!(decoded < 400.0, "{decoded} decodes");
    // The provider's connection pool is still good for the next call.
    assert!(p.infer(&ask("Say hi.", 4))?.usage.completion_tokens > 0);
    Ok(())
}

#[test]
fn a_server_killed_mid_stream_is_an_interrupted_stream() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let server = TestServer::start(&install);
    let pid = server.pid() as i32;
    let p = LlamaCppInferenceProvider::new("gemma", &server.base_url(), &HttpOptions::default());
    let mut n = 0;
    let r = p.infer_stream(
        &ask("Write a very long story about a dragon.", 2000),
        &CancelToken::new(),
        &mut |_| {
            n += 1;
            if n == 3 {
                // SAFETY: kill(2) on the test's own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            StreamControl::Continue
        },
    );
    match r {
        Err(e @ InferenceError::StreamInterrupted { .. }) => {
            assert!(e.is_transient());
            assert!(
                e.to_string().contains("llama-server is still running"),
                "{e}"
            );
        }
        other => return Err(format!("{other:?}").into()),
    }
    Ok(())
}

#[test]
fn stub_malformed_events_and_a_missing_final_event_are_their_own_errors() -> TestResult {
    let delta = r#"data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}"#;
    let stub = StubServer::start(vec![
        sse(&format!("{delta}\n\ndata: {{\"choices\": [tru\n\n")),
        sse(&format!("{delta}\n\nretry 5\n\n")),
        sse(&format!("{delta}\n\ndata: [DONE]\n\n")),
    ]);
    let p = LlamaCppInferenceProvider::new("m", &stub.base_url(), &HttpOptions::default());
    for _ in 0..2 {
        match p.infer(&ask("x", 4)) {
            Err(e @ InferenceError::MalformedEvent { .. }) => {
                assert!(!e.is_transient());
            }
            other => return Err(format!("{other:?}").into()),
        }
    }
    match p.infer(&ask("x", 4)) {
        Err(e @ InferenceError::StreamIncomplete { events: 1, .. }) => {
            assert!(e.to_string().contains("include_usage"), "{e}");
        }
        other => return Err(format!("{other:?}").into()),
    }
    Ok(())
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "color": {"type": "string", "enum": ["red", "green", "blue"]}
        },
        "required": ["name", "age", "color"],
        "additionalProperties": false
    })
}

#[test]
fn a_schema_constrained_answer_parses_and_matches_its_schema() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let server = TestServer::start(&install);
    let p = LlamaCppInferenceProvider::new("gemma", &server.base_url(), &HttpOptions::default());
    let mut req = ask("Describe a person.", 200);
    req.config.response_format = Some(ResponseFormat::JsonSchema {
        json_schema: JsonSchemaFormat {
            name: Some("person".into()),
            schema: person_schema(),
            strict: Some(true),
        },
    });
    let r = p.infer(&req)?;
    assert_eq!(r.finish_reason, FinishReason::Stop, "{:?}", r.text);
    let v: Value = serde_json::from_str(&r.text).map_err(|e| format!("{e}: {:?}", r.text))?;
    let obj = v.as_object().ok_or("not an object")?;
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["age", "color", "name"],
        "exactly the schema's properties"
    );
    assert!(obj["name"].is_string());
    assert!(matches!(obj["age"].as_u64(), Some(0..=150)), "{v}");
    assert!(
        ["red", "green", "blue"].contains(&obj["color"].as_str().unwrap_or("")),
        "{v}"
    );
    Ok(())
}

#[test]
fn a_grammar_and_sampling_fields_reach_the_server() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let server = TestServer::start(&install);
    let p = LlamaCppInferenceProvider::new("gemma", &server.base_url(), &HttpOptions::default());
    let mut req = ask("Is the sky blue? Answer yes or no.", 8);
    req.config.grammar = Some(r#"root ::= ("yes" | "no") "." "#.into());
    req.config.top_k = Some(7);
    req.config.min_p = Some(0.2);
    req.config.repeat_penalty = Some(1.3);
    req.config.presence_penalty = Some(0.4);
    req.config.frequency_penalty = Some(0.25);
    let r = p.infer(&req)?;
    assert!(r.text == "yes." || r.text == "no.", "{:?}", r.text);
    // The slot keeps the parameters of its last task.
    let (_, slots) = raw_http(server.port, "GET", "/slots", "")?;
    let slots: Value = serde_json::from_str(&slots)?;
    let params = slots
        .as_array()
        .and_then(|s| s.iter().find(|s| s["params"]["top_k"] == 7))
        .map(|s| &s["params"])
        .ok_or("no slot ran with top_k 7")?;
    let close = |k: &str, want: f64| (params[k].as_f64().unwrap_or(-1.0) - want).abs() < 1e-6;
    assert!(
        close("min_p", 0.2) && close("repeat_penalty", 1.3),
        "{params}"
    );
    assert!(
        close("presence_penalty", 0.4) && close("frequency_penalty", 0.25),
        "{params}"
    );
    Ok(())
}

fn weather_tool() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: Some("The weather in a city".into()),
        parameters: json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"]
        }),
    }
}

/// The shipped model never emitted a tool call on this llama-server: `tool_choice` `required`
/// is not enforced for its template (tried: its own, chatml, a Hermes/Qwen 2.5 template, and
/// the Gemma template with `<tool_call>` tags in `fixtures/`), and the server refuses a grammar
/// together with tools. So the server is shown to receive the tools (its template renders them
/// into the prompt), and the parser is tested on stub answers in llama-server's OpenAI format,
/// streamed and not.
#[test]
fn tools_reach_a_jinja_server() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gemma-tools.jinja"
    );
    let server = TestServer::start_with(&install, &["--jinja", "--chat-template-file", template]);
    let p = LlamaCppInferenceProvider::new("gemma", &server.base_url(), &HttpOptions::default());
    let plain = p.infer(&ask("What is the weather in Paris?", 4))?;
    let mut req = ask("What is the weather in Paris?", 4);
    req.config.tools = vec![weather_tool()];
    req.config.tool_choice = Some(ToolChoice::Auto);
    let with_tools = p.infer(&req)?;
    assert!(
        with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 10,
        "the tool definition entered the prompt: {} vs {}",
        with_tools.usage.prompt_tokens,
        plain.usage.prompt_tokens
    );
    Ok(())
}

#[test]
fn stub_tool_calls_are_parsed_streamed_and_not_and_sent_back_as_messages() -> TestResult {
    let tail = r#"data: {"choices":[{"finish_reason":"tool_calls","index":0,"delta":{}}]}

data: {"choices":[],"usage":{"completion_tokens":9,"prompt_tokens":40,"total_tokens":49}}

data: [DONE]

"#;
    let streamed = format!(
        "{}\n\n{}\n\n{tail}",
        r#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":"}}]}}]}"#,
        r#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" \"Paris\"}"}}]}}]}"#,
    );
    let plain = r#"{"choices":[{"finish_reason":"tool_calls","index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_2","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Rome\"}"}}]}}],"usage":{"completion_tokens":9,"prompt_tokens":40,"total_tokens":49},"model":"m"}"#;
    let stub = StubServer::start(vec![sse(&streamed), crate::stub::canned(200, plain)]);
    let p = LlamaCppInferenceProvider::new("m", &stub.base_url(), &HttpOptions::default());
    let mut req = ask("What is the weather?", 32);
    req.config.tools = vec![weather_tool()];
    req.config.tool_choice = Some(ToolChoice::Function("get_weather".into()));
    let a = p.infer(&req)?;
    assert_eq!(a.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        a.tool_calls,
        vec![ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: json!({"city": "Paris"}),
        }]
    );
    let sent: Value = serde_json::from_str(&stub.requests.recv_timeout(Duration::from_secs(5))?)?;
    assert_eq!(sent["tools"][0]["type"], "function");
    assert_eq!(sent["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(
        sent["tool_choice"],
        json!({"type": "function", "function": {"name": "get_weather"}})
    );

    // The agent answers the call: the model's turn and the tool's output go back as messages.
    req.context.entries = vec![
        ContextEntry {
            tool_calls: a.tool_calls.clone(),
            ..ContextEntry::new(SourceType::Model, "")
        },
        ContextEntry {
            tool_call_id: Some("call_1".into()),
            ..ContextEntry::new(SourceType::Tool, "18 C and sunny")
        },
    ];
    let b = p.infer(&req)?;
    assert_eq!(b.tool_calls[0].arguments, json!({"city": "Rome"}));
    assert_eq!(b.text, "");
    let sent: Value = serde_json::from_str(&stub.requests.recv_timeout(Duration::from_secs(5))?)?;
    let msgs = sent["messages"].as_array().ok_or("no messages")?;
    let assistant = &msgs[msgs.len() - 2];
    assert_eq!(assistant["tool_calls"][0]["id"], "call_1");
    assert_eq!(
        assistant["tool_calls"][0]["function"]["arguments"],
        r#"{"city":"Paris"}"#
    );
    assert_eq!(
        msgs[msgs.len() - 1],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"})
    );
    Ok(())
}
