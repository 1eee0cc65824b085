//! Remote models of kind `openai`: any engine that serves OpenAI's `/v1/chat/completions` and
//! `/v1/models` (vLLM, SGLang). The engine here is a STUB (named so): no GPU engine runs on
//! this machine, so a loopback server answers as OpenAI's API reference documents it (model
//! list, streamed chunks, a last chunk with usage for `stream_options.include_usage`, 401 for
//! a wrong key; as vLLM documents it, `/tokenize` and a 400 for a JSON schema it cannot
//! enforce), and records what it was sent.

use correx::{
    CancelToken, DefaultModelManager, EndpointKind, EventStore, GenerationConfig, InferenceError,
    InferenceRequest, ManagerOptions, ModelDescriptor, ModelLoadError, ModelManager,
    SqliteEventStore,
};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const SERVED: &str = "org/served-model";

/// One request the stub engine was sent: its head lines and its body.
type Seen = (Vec<String>, Value);

/// The stub engine, and what it was sent.
struct Stub {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// What the stub engine offers.
#[derive(Clone, Copy)]
struct Offers {
    /// The model it lists and serves.
    serves: &'static str,
    /// vLLM's `/tokenize`.
    tokenize: bool,
    /// A JSON-schema `response_format` (else 400, as an engine without guided decoding).
    json_schema: bool,
    /// Usage in streams when asked.
    usage: bool,
}

const PLAIN: Offers = Offers {
    serves: SERVED,
    tokenize: false,
    json_schema: true,
    usage: true,
};

fn respond(out: &mut impl Write, status: &str, content_type: &str, body: &str) {
    let _ = write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

impl Stub {
    /// The last request it was sent.
    fn last(&self) -> Result<Seen, Box<dyn std::error::Error>> {
        let seen = self.seen.lock().map_err(|_| "poisoned")?;
        Ok(seen.last().cloned().ok_or("no request")?)
    }

    /// How many requests it was sent.
    fn count(&self) -> Result<usize, Box<dyn std::error::Error>> {
        Ok(self.seen.lock().map_err(|_| "poisoned")?.len())
    }

    fn start(key: &'static str) -> std::io::Result<Stub> {
        Stub::offering(key, PLAIN)
    }

    fn offering(key: &'static str, offers: Offers) -> std::io::Result<Stub> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let mut reader = BufReader::new(conn.try_clone().expect("a clone"));
                let mut out = conn;
                let mut head = Vec::new();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    head.push(line.trim_end().to_owned());
                }
                let length = head
                    .iter()
                    .find_map(|h| {
                        h.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                    })
                    .unwrap_or(0);
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                log.lock()
                    .expect("the log")
                    .push((head.clone(), body.clone()));
                let authorized = head
                    .iter()
                    .any(|h| h.eq_ignore_ascii_case(&format!("authorization: Bearer {key}")));
                let request_line = head.first().cloned().unwrap_or_default();
                if !authorized {
                    respond(
                        &mut out,
                        "401 Unauthorized",
                        "application/json",
                        r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}"#,
                    );
                    continue;
                }
                if request_line.starts_with("GET /v1/models ") {
                    let list = json!({"object": "list", "data": [{"id": offers.serves, "object": "model", "owned_by": "stub"}]});
                    respond(&mut out, "200 OK", "application/json", &list.to_string());
                    continue;
                }
                if offers.tokenize
                    && request_line.starts_with("POST /tokenize ")
                    && body["model"] == offers.serves
                {
                    // One token per word, as ids.
                    let n = body["prompt"]
                        .as_str()
                        .unwrap_or("")
                        .split_whitespace()
                        .count();
                    let tokens: Vec<usize> = (0..n).map(|i| 100 + i).collect();
                    let answer = json!({"count": n, "max_model_len": 4096, "tokens": tokens});
                    respond(&mut out, "200 OK", "application/json", &answer.to_string());
                    continue;
                }
                if !request_line.starts_with("POST /v1/chat/completions ")
                    || body["model"] != offers.serves
                {
                    respond(
                        &mut out,
                        "404 Not Found",
                        "application/json",
                        r#"{"error":{"message":"The model does not exist","type":"invalid_request_error"}}"#,
                    );
                    continue;
                }
                if !offers.json_schema && body["response_format"]["type"] == "json_schema" {
                    respond(
                        &mut out,
                        "400 Bad Request",
                        "application/json",
                        r#"{"error":{"message":"guided decoding is not enabled","type":"BadRequestError"}}"#,
                    );
                    continue;
                }
                let chunk = |delta: Value, finish: Value| {
                    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                           "model": offers.serves,
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
                };
                let mut events = vec![
                    chunk(json!({"role": "assistant", "content": ""}), Value::Null),
                    chunk(json!({"content": "Hello"}), Value::Null),
                    chunk(json!({"content": " there"}), Value::Null),
                    chunk(json!({}), json!("stop")),
                ];
                if offers.usage && body["stream_options"]["include_usage"] == true {
                    events.push(
                        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                        "created": 1, "model": offers.serves, "choices": [],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}),
                    );
                }
                let mut sse: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
                sse.push_str("data: [DONE]\n\n");
                respond(&mut out, "200 OK", "text/event-stream", &sse);
            }
        });
        Ok(Stub { port, seen })
    }
}

fn manager(
    dir: &std::path::Path,
) -> Result<(DefaultModelManager, Arc<SqliteEventStore>), Box<dyn std::error::Error>> {
    let store = Arc::new(SqliteEventStore::open(dir.join("events.db"))?);
    let events: Arc<dyn EventStore> = store.clone();
    Ok((
        DefaultModelManager::new(events, ManagerOptions::default())?,
        store,
    ))
}

fn descriptor(port: u16, key_env: &str) -> ModelDescriptor {
    let mut d = ModelDescriptor::remote("engine", vec![format!("http://127.0.0.1:{port}")]);
    d.endpoint_kind = EndpointKind::Openai;
    d.api_key_env = Some(key_env.into());
    d.served_model = Some(SERVED.into());
    d
}

#[test]
fn an_openai_endpoint_gets_standard_requests_with_its_key_and_refuses_what_it_lacks() -> TestResult
{
    const KEY: &str = "sk-stub-0123456789";
    let stub = Stub::start(KEY)?;
    let dir = crate::util::TempDir::new("openai");
    let (models, store) = manager(dir.path())?;

    // The key's variable unset: the load fails naming the variable.
    let unset = "CORREX_TEST_OPENAI_KEY_UNSET";
    let e = models
        .load(&descriptor(stub.port, unset))
        .err()
        .ok_or("a load without its key")?;
    assert!(e.to_string().contains(unset), "{e}");
    // A wrong key: the engine's 401 says so, and the key is quoted nowhere.
    // The variables are this test's own; nothing else reads them.
    std::env::set_var("CORREX_TEST_OPENAI_KEY_WRONG", "sk-wrong-key");
    let e = models
        .load(&descriptor(stub.port, "CORREX_TEST_OPENAI_KEY_WRONG"))
        .err()
        .ok_or("a load with a wrong key")?;
    assert!(
        matches!(e, ModelLoadError::EndpointsDown { .. }) && e.to_string().contains("401"),
        "{e}"
    );
    assert!(!e.to_string().contains("sk-wrong-key"), "{e}");

    std::env::set_var("CORREX_TEST_OPENAI_KEY", KEY);
    let d = descriptor(stub.port, "CORREX_TEST_OPENAI_KEY");
    let provider = models.load(&d)?;
    let request = InferenceRequest {
        config: GenerationConfig {
            temperature: 0.0,
            max_tokens: 8,
            seed: Some(3),
            ..GenerationConfig::default()
        },
        ..InferenceRequest::default()
    };
    let mut pieces = String::new();
    let answer = provider.infer_stream(&request, &CancelToken::new(), &mut |c| {
        pieces.push_str(c.text);
        correx::StreamControl::Continue
    })?;
    assert_eq!(
        (answer.text.as_str(), pieces.as_str()),
        ("Hello there", "Hello there")
    );
    assert_eq!(
        (answer.usage.prompt_tokens, answer.usage.completion_tokens),
        (5, 2)
    );
    assert_eq!(answer.model, "engine");

    let (head, body) = stub.last()?;
    assert!(
        head[0].starts_with("POST /v1/chat/completions "),
        "{head:?}"
    );
    assert_eq!(body["model"], SERVED);
    assert_eq!(
        (
            body["stream"].clone(),
            body["stream_options"]["include_usage"].clone()
        ),
        (json!(true), json!(true))
    );
    let standard = [
        "model",
        "messages",
        "temperature",
        "top_p",
        "max_tokens",
        "stop",
        "stream",
        "stream_options",
        "seed",
    ];
    let extra: Vec<_> = body
        .as_object()
        .ok_or("a body object")?
        .keys()
        .filter(|k| !standard.contains(&k.as_str()))
        .collect();
    assert!(
        extra.is_empty(),
        "llama-server fields sent to an openai engine: {extra:?}"
    );

    // What only llama-server has is refused before anything is sent.
    let sent = stub.count()?;
    for (name, config) in [
        (
            "grammar",
            GenerationConfig {
                grammar: Some("root ::= \"a\"".into()),
                ..GenerationConfig::default()
            },
        ),
        (
            "top_k",
            GenerationConfig {
                top_k: Some(5),
                ..GenerationConfig::default()
            },
        ),
        (
            "mirostat",
            GenerationConfig {
                mirostat: Some(2),
                ..GenerationConfig::default()
            },
        ),
    ] {
        let r = provider.infer(&InferenceRequest {
            config,
            ..InferenceRequest::default()
        });
        match r {
            Err(InferenceError::Unsupported {
                feature,
                endpoint_kind,
            }) => {
                assert_eq!((feature.as_str(), endpoint_kind.as_str()), (name, "openai"));
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert!(matches!(
        provider.tokenizer().tokenize("hi"),
        Err(InferenceError::Unsupported { .. })
    ));
    assert_eq!(stub.count()?, sent, "nothing sent");

    // The key is in no event, and the descriptor names only its variable.
    let all = store.read_all(1, 10_000)?;
    assert!(all.iter().any(|e| e.type_id == "inference.completed"));
    for e in &all {
        assert!(
            !e.payload.to_string().contains(KEY),
            "{}: {}",
            e.type_id,
            e.payload
        );
    }
    let direct = correx::LlamaCppInferenceProvider::openai(
        "engine",
        &format!("http://127.0.0.1:{}", stub.port),
        &correx::HttpOptions::default(),
        Some(SERVED),
        Some(KEY),
    );
    assert!(!format!("{d:?} {direct:?}").contains(KEY));
    Ok(())
}

#[test]
fn endpoint_settings_are_checked_before_anything_is_called() {
    let mut local = ModelDescriptor::new("m", "/m.gguf", correx::ResidencyMode::Persistent);
    local.endpoint_kind = EndpointKind::Openai;
    let e = local
        .validate()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("served at endpoints"), "{e}");
    let bad_name = descriptor(1, "NOT A NAME");
    let e = bad_name
        .validate()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("not an environment variable name"), "{e}");
    let mut blank = descriptor(1, "PATH");
    blank.served_model = Some(" ".into());
    let e = blank
        .validate()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("served_model is empty"), "{e}");
    // A kind correx does not speak is refused where the descriptor is read.
    let parsed = serde_json::from_value::<ModelDescriptor>(json!({
        "model_id": "m", "residency": "persistent", "endpoints": ["http://127.0.0.1:1"],
        "endpoint_kind": "vllm"}));
    assert!(parsed.is_err());
}

#[test]
fn an_openai_endpoint_is_probed_at_load_for_what_it_offers() -> TestResult {
    const KEY: &str = "sk-stub-probe";
    let dir = crate::util::TempDir::new("openai-probe");
    let (models, store) = manager(dir.path())?;
    std::env::set_var("CORREX_TEST_OPENAI_PROBE_KEY", KEY);
    let descriptor = |port: u16, id: &str| {
        let mut d = descriptor(port, "CORREX_TEST_OPENAI_PROBE_KEY");
        d.model_id = id.into();
        d
    };

    // vLLM-like: it tokenizes, and has no guided decoding.
    let vllm = Stub::offering(
        KEY,
        Offers {
            tokenize: true,
            json_schema: false,
            ..PLAIN
        },
    )?;
    let provider = models.load(&descriptor(vllm.port, "vllm"))?;
    let loaded = store
        .read_all(1, 1000)?
        .into_iter()
        .rfind(|e| e.type_id == "model.loaded")
        .ok_or("model.loaded")?;
    assert_eq!(
        loaded.payload["endpoint_features"],
        json!([{"url": format!("http://127.0.0.1:{}", vllm.port), "tokenize": true,
                "json_schema": false, "llama_extras": false}]),
        "{}",
        loaded.payload
    );
    // Tokenizing goes to its /tokenize, in vLLM's shape.
    assert_eq!(
        provider.tokenizer().tokenize("three little words")?.len(),
        3
    );
    let (head, body) = vllm.last()?;
    assert!(head[0].starts_with("POST /tokenize "), "{head:?}");
    assert_eq!(
        (body["model"].as_str(), body["prompt"].as_str()),
        (Some(SERVED), Some("three little words"))
    );
    // A JSON schema it cannot enforce is refused before anything is sent, not ignored.
    let sent = vllm.count()?;
    let schema = InferenceRequest {
        config: GenerationConfig {
            response_format: Some(correx::ResponseFormat::JsonSchema {
                json_schema: correx::JsonSchemaFormat {
                    name: Some("answer".into()),
                    schema: json!({"type": "object"}),
                    strict: None,
                },
            }),
            ..GenerationConfig::default()
        },
        ..InferenceRequest::default()
    };
    match provider.infer(&schema) {
        Err(InferenceError::Unsupported { feature, .. }) => {
            assert_eq!(feature, "response_format json_schema")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(vllm.count()?, sent);

    // One with guided decoding takes the schema.
    let guided = Stub::offering(KEY, PLAIN)?;
    let provider = models.load(&descriptor(guided.port, "guided"))?;
    assert_eq!(provider.infer(&schema)?.text, "Hello there");
    let (_, body) = guided.last()?;
    assert_eq!(body["response_format"]["type"], "json_schema", "{body}");
    // It does not tokenize: a count falls back to an estimate, tokenizing is refused.
    assert!(matches!(
        provider.tokenizer().tokenize("hi"),
        Err(InferenceError::Unsupported { .. })
    ));

    // A served name it does not list: the load fails saying what it serves.
    let other = Stub::offering(
        KEY,
        Offers {
            serves: "org/another-model",
            ..PLAIN
        },
    )?;
    let e = models
        .load(&descriptor(other.port, "typo"))
        .err()
        .ok_or("a load of a model the endpoint does not serve")?;
    assert!(
        matches!(e, ModelLoadError::EndpointsDown { .. })
            && e.to_string().contains("org/another-model")
            && e.to_string().contains("served_model"),
        "{e}"
    );

    // Streams without usage: the load fails saying so, instead of every inference after it.
    let silent = Stub::offering(
        KEY,
        Offers {
            usage: false,
            ..PLAIN
        },
    )?;
    let e = models
        .load(&descriptor(silent.port, "silent"))
        .err()
        .ok_or("a load of an engine whose streams carry no usage")?;
    assert!(
        e.to_string()
            .contains("carry no usage (stream_options.include_usage)"),
        "{e}"
    );
    Ok(())
}
