//! [`LlamaCppInferenceProvider`] and [`LlamaCppTokenizer`]: llama-server's OpenAI-compatible
//! API over one shared keep-alive HTTP agent.

use super::stream::{read_events, tool_call, usage_of};
use super::{
    CapabilityScore, ContextPack, FinishReason, InferenceError, InferenceProvider,
    InferenceRequest, InferenceResponse, ModelCapability, ProviderHealth, ResponseFormat,
    SourceType, StreamChunk, StreamControl, Tokenizer, ToolChoice,
};
use crate::cancel::CancelToken;
use crate::http::{Endpoint, HttpClient};
use crate::ids::ProviderId;
use serde_json::{json, Value};
use std::io::{BufReader, Read};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long each request of a probe may take, at most (its completions are one token).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the start of an error body quoted in an error may be.
const BODY_PREFIX: usize = 300;

/// What a remote model's endpoints speak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndpointKind {
    /// llama-server: its `/health`, `/tokenize`, GBNF `grammar`, sampling extras (`top_k`,
    /// `min_p`, mirostat, ...) and `timings`.
    #[default]
    LlamaServer,
    /// Any engine serving OpenAI's `/v1/chat/completions` and `/v1/models` (vLLM, SGLang,
    /// ...): health is `/v1/models`; a request needing what only llama-server has (a grammar,
    /// a sampling extra, tokenizing) fails with [`crate::InferenceError::Unsupported`]
    /// before anything is sent.
    Openai,
}

impl EndpointKind {
    pub(crate) fn is_default(&self) -> bool {
        *self == EndpointKind::LlamaServer
    }

    /// `llama-server` or `openai`.
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointKind::LlamaServer => "llama-server",
            EndpointKind::Openai => "openai",
        }
    }
}

/// What one endpoint offers, as probed when its model was loaded (`model.loaded` records it
/// per endpoint). A request that needs what its endpoint lacks goes to one that has it, or
/// fails with [`crate::InferenceError::Unsupported`] before anything is sent.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EndpointFeatures {
    /// It tokenizes (`/tokenize`: llama-server's, or vLLM's with `model` and `prompt`).
    pub tokenize: bool,
    /// It accepts a JSON-schema `response_format` (structured output). Accepting is what a
    /// probe can see: an engine that takes the field and ignores it cannot be told apart.
    pub json_schema: bool,
    /// llama-server's extras: a GBNF `grammar`, `top_k`, `min_p`, mirostat, `timings`.
    pub llama_extras: bool,
}

impl EndpointFeatures {
    /// llama-server's: everything.
    pub const LLAMA_SERVER: EndpointFeatures = EndpointFeatures {
        tokenize: true,
        json_schema: true,
        llama_extras: true,
    };
}

/// Settings of the HTTP client.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// TCP connect timeout; default 2 s (the server is local).
    pub connect_timeout: Duration,
    /// How long to wait for the server's next bytes: the start of the answer (a long prompt is
    /// read first) or, while it streams, the next piece; default 300 s.
    pub read_timeout: Duration,
    /// Timeout of `/health` calls; default 2 s.
    pub health_timeout: Duration,
    /// Timeout of a `/tokenize` call, which answers in milliseconds; default 10 s.
    pub tokenize_timeout: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(300),
            health_timeout: Duration::from_secs(2),
            tokenize_timeout: Duration::from_secs(10),
        }
    }
}

/// One shared keep-alive agent that ignores proxy variables (the server is local) and hands
/// every status back as a response.
pub(crate) fn agent(options: &HttpOptions) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .proxy(None)
        .http_status_as_error(false)
        .timeout_connect(Some(options.connect_timeout))
        .timeout_recv_response(Some(options.read_timeout))
        .timeout_recv_body(Some(options.read_timeout))
        .build();
    ureq::Agent::new_with_config(config)
}

fn transport(url: &str, e: ureq::Error) -> InferenceError {
    let detail = e.to_string();
    let url = url.to_owned();
    match e {
        ureq::Error::Timeout(_) => InferenceError::Timeout { url, detail },
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => {
            InferenceError::ConnectionRefused { url, detail }
        }
        ureq::Error::Io(ref io) => match io.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                InferenceError::ConnectionRefused { url, detail }
            }
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                InferenceError::Timeout { url, detail }
            }
            _ => InferenceError::Transport { url, detail },
        },
        _ => InferenceError::Transport { url, detail },
    }
}

fn prefix(body: &str) -> String {
    crate::text::prefix(body, BODY_PREFIX).to_owned()
}

/// Maps a non-2xx answer to an error, using the server's own `{"error": {...}}` when present.
pub(crate) fn http_error(status: u16, body: &str) -> InferenceError {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let err = parsed.as_ref().and_then(|v| v.get("error"));
    let message = err
        .and_then(|e| e.get("message").and_then(Value::as_str).map(str::to_owned))
        .or_else(|| err.and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| prefix(body));
    let kind = err.and_then(|e| e.get("type")).and_then(Value::as_str);
    if status == 400 && kind == Some("exceed_context_size_error") {
        return InferenceError::ContextExceeded {
            message,
            prompt_tokens: err
                .and_then(|e| e.get("n_prompt_tokens"))
                .and_then(Value::as_u64),
            context_size: err.and_then(|e| e.get("n_ctx")).and_then(Value::as_u64),
        };
    }
    InferenceError::Http { status, message }
}

/// Sends `body` to `url` and returns the parsed 2xx JSON body.
fn post_json(
    agent: &ureq::Agent,
    url: &str,
    body: &Value,
    authorization: Option<&str>,
) -> Result<Value, InferenceError> {
    let bytes = body.to_string();
    let mut post = agent.post(url).header("content-type", "application/json");
    if let Some(a) = authorization {
        post = post.header("authorization", a);
    }
    let mut resp = post.send(bytes.as_bytes()).map_err(|e| transport(url, e))?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .with_config()
        .limit(64 * 1024 * 1024)
        .read_to_string()
        .map_err(|e| match e {
            ureq::Error::Timeout(_) | ureq::Error::Io(_) => transport(url, e),
            other => InferenceError::MalformedBody {
                detail: other.to_string(),
                body_prefix: String::new(),
            },
        })?;
    if !(200..300).contains(&status) {
        return Err(http_error(status, &text));
    }
    serde_json::from_str(&text).map_err(|e| InferenceError::MalformedBody {
        detail: format!("not JSON: {e}"),
        body_prefix: prefix(&text),
    })
}

/// The chat messages for a context pack: L0 system, L1 user, L2 assistant (model) or user
/// (user, tool); an empty pack is one empty user message.
pub fn messages(pack: &ContextPack) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(s) = &pack.system {
        out.push(json!({"role": "system", "content": s}));
    }
    if let Some(t) = &pack.task {
        out.push(json!({"role": "user", "content": t}));
    }
    for e in &pack.entries {
        match (e.source, &e.tool_call_id) {
            (SourceType::Model, _) if !e.tool_calls.is_empty() => {
                let calls: Vec<Value> = e
                    .tool_calls
                    .iter()
                    .map(|c| {
                        let arguments = match &c.arguments {
                            Value::String(raw) => raw.clone(),
                            other => other.to_string(),
                        };
                        json!({"id": c.id, "type": "function",
                               "function": {"name": c.name, "arguments": arguments}})
                    })
                    .collect();
                out.push(json!({"role": "assistant", "content": e.content, "tool_calls": calls}));
            }
            (SourceType::Model, _) => out.push(json!({"role": "assistant", "content": e.content})),
            (SourceType::Tool, Some(id)) => {
                out.push(json!({"role": "tool", "tool_call_id": id, "content": e.content}))
            }
            (SourceType::User | SourceType::Tool, _) => {
                out.push(json!({"role": "user", "content": e.content}))
            }
        }
    }
    if out.is_empty() {
        out.push(json!({"role": "user", "content": ""}));
    }
    out
}

/// The `/v1/chat/completions` body for a request, not streamed (what a plain OpenAI client
/// sends; correx itself always streams, see [`stream_body`]).
pub fn chat_body(model_id: &str, request: &InferenceRequest) -> Value {
    let c = &request.config;
    let mut body = json!({
        "model": model_id,
        "messages": messages(&request.context),
        "temperature": c.temperature,
        "top_p": c.top_p,
        "max_tokens": c.max_tokens,
        "stop": c.stop,
        "stream": false,
    });
    let Some(obj) = body.as_object_mut() else {
        return body;
    };
    let mut put = |key: &str, v: Option<Value>| {
        if let Some(v) = v {
            obj.insert(key.into(), v);
        }
    };
    put("seed", c.seed.map(Value::from));
    put("top_k", c.top_k.map(Value::from));
    put("min_p", c.min_p.map(Value::from));
    put("typical_p", c.typical_p.map(Value::from));
    put("repeat_penalty", c.repeat_penalty.map(Value::from));
    put("repeat_last_n", c.repeat_last_n.map(Value::from));
    put("presence_penalty", c.presence_penalty.map(Value::from));
    put("frequency_penalty", c.frequency_penalty.map(Value::from));
    put("mirostat", c.mirostat.map(Value::from));
    put("mirostat_tau", c.mirostat_tau.map(Value::from));
    put("mirostat_eta", c.mirostat_eta.map(Value::from));
    put("grammar", c.grammar.clone().map(Value::from));
    put(
        "response_format",
        c.response_format
            .as_ref()
            .filter(|f| **f != ResponseFormat::Text)
            .and_then(|f| serde_json::to_value(f).ok()),
    );
    if !c.tools.is_empty() {
        let tools: Vec<Value> = c
            .tools
            .iter()
            .map(|t| {
                let mut f = json!({"name": t.name, "parameters": t.parameters});
                if let (Some(d), Some(o)) = (&t.description, f.as_object_mut()) {
                    o.insert("description".into(), json!(d));
                }
                json!({"type": "function", "function": f})
            })
            .collect();
        put("tools", Some(Value::Array(tools)));
    }
    put(
        "tool_choice",
        c.tool_choice.as_ref().map(|t| match t {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Function(name) => json!({"type": "function", "function": {"name": name}}),
        }),
    );
    body
}

/// [`chat_body`] streamed, asking for usage (and llama-server's timings) in the last event.
pub fn stream_body(model_id: &str, request: &InferenceRequest) -> Value {
    let mut body = chat_body(model_id, request);
    if let Some(obj) = body.as_object_mut() {
        obj.insert("stream".into(), json!(true));
        obj.insert("stream_options".into(), json!({"include_usage": true}));
    }
    body
}

fn malformed(detail: &str, body: &Value) -> InferenceError {
    InferenceError::MalformedBody {
        detail: detail.to_owned(),
        body_prefix: prefix(&body.to_string()),
    }
}

/// Maps a chat-completions body to a response.
pub fn parse_chat_response(
    body: &Value,
    latency_ms: u64,
    fallback_model: &str,
) -> Result<InferenceResponse, InferenceError> {
    let choice = body
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| malformed("no choices[0]", body))?;
    let message = choice
        .get("message")
        .ok_or_else(|| malformed("choices[0].message is missing", body))?;
    let tool_calls: Vec<_> = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    let f = c.get("function");
                    fn field(v: Option<&Value>) -> &str {
                        v.and_then(Value::as_str).unwrap_or_default()
                    }
                    let arguments = match f.and_then(|f| f.get("arguments")) {
                        Some(Value::String(s)) => s.clone(),
                        Some(other) => other.to_string(),
                        None => String::new(),
                    };
                    tool_call(
                        field(c.get("id")).to_owned(),
                        field(f.and_then(|f| f.get("name"))).to_owned(),
                        &arguments,
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let text = match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None if !tool_calls.is_empty() => String::new(),
        Some(Value::Null) => String::new(),
        _ => return Err(malformed("choices[0].message.content is missing", body)),
    };
    let finish = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(FinishReason::from_server)
        .unwrap_or_else(|| FinishReason::Unknown("missing".into()));
    let usage = body
        .get("usage")
        .ok_or_else(|| malformed("usage is missing", body))?;
    let usage = usage_of(usage).ok_or_else(|| malformed("usage lacks its counts", body))?;
    Ok(InferenceResponse {
        text,
        usage,
        finish_reason: finish,
        latency_ms,
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(fallback_model)
            .to_owned(),
        timings: body.get("timings").cloned(),
        reasoning: message
            .get("reasoning_content")
            .and_then(Value::as_str)
            .filter(|r| !r.is_empty())
            .map(str::to_owned),
        tool_calls,
        endpoint: None,
    })
}

/// Calls llama-server's `/tokenize`; falls back to characters / 4 in `count` when the server is
/// unreachable.
#[derive(Clone, Debug)]
pub struct LlamaCppTokenizer {
    url: String,
    agent: ureq::Agent,
    authorization: Option<Redacted>,
    /// vLLM's shape: the body names the model and the text is its `prompt`.
    model: Option<String>,
}

impl LlamaCppTokenizer {
    /// A tokenizer for an endpoint that cannot tokenize (an `openai` one): `tokenize` is
    /// [`InferenceError::Unsupported`]; `count` approximates characters / 4.
    pub(crate) fn unsupported(options: &HttpOptions) -> Self {
        LlamaCppTokenizer {
            url: String::new(),
            agent: agent(options),
            authorization: None,
            model: None,
        }
    }

    /// vLLM's `/tokenize` at `base_url` (`{"model", "prompt"}`), for model `served`.
    fn openai(base_url: &str, options: &HttpOptions, served: &str) -> Self {
        LlamaCppTokenizer {
            model: Some(served.to_owned()),
            ..Self::new(base_url, options)
        }
    }

    /// A tokenizer for the server at `base_url` with its own agent, whose calls time out after
    /// `options.tokenize_timeout`.
    pub fn new(base_url: &str, options: &HttpOptions) -> Self {
        Self::with_agent(
            base_url,
            agent(&HttpOptions {
                read_timeout: options.tokenize_timeout,
                ..options.clone()
            }),
        )
    }

    pub(crate) fn with_agent(base_url: &str, agent: ureq::Agent) -> Self {
        LlamaCppTokenizer {
            url: format!("{}/tokenize", base_url.trim_end_matches('/')),
            agent,
            authorization: None,
            model: None,
        }
    }
}

impl Tokenizer for LlamaCppTokenizer {
    fn tokenize(&self, text: &str) -> Result<Vec<i64>, InferenceError> {
        if self.url.is_empty() {
            return Err(InferenceError::Unsupported {
                feature: "tokenize".into(),
                endpoint_kind: EndpointKind::Openai.as_str().into(),
            });
        }
        let auth = self.authorization.as_ref().map(|Redacted(a)| a.as_str());
        let request = match &self.model {
            // No chat template around it, as llama-server's.
            Some(m) => json!({"model": m, "prompt": text, "add_special_tokens": false}),
            None => json!({"content": text}),
        };
        let body = post_json(&self.agent, &self.url, &request, auth)?;
        let tokens = body
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or_else(|| malformed("no tokens array", &body))?;
        tokens
            .iter()
            .map(|t| {
                // With with_pieces the server sends objects; plain ids otherwise.
                t.as_i64()
                    .or_else(|| t.get("id").and_then(Value::as_i64))
                    .ok_or_else(|| malformed("a token is not an integer", &body))
            })
            .collect()
    }

    fn count(&self, text: &str) -> usize {
        match self.tokenize(text) {
            Ok(t) => t.len(),
            Err(e) => {
                let approx = text.chars().count() / 4;
                log::warn!(
                    "tokenizer unavailable ({e}); approximating {approx} tokens as characters / 4"
                );
                approx
            }
        }
    }
}

/// llama-server's OpenAI-compatible chat API as an [`InferenceProvider`].
///
/// Every completion streams, also through [`InferenceProvider::infer`]: closing a streamed
/// request is what makes llama-server stop decoding, so a cancel frees the server's slot
/// instead of leaving it to generate an abandoned answer to `max_tokens`. Clones share their
/// connections.
#[derive(Clone, Debug)]
pub struct LlamaCppInferenceProvider {
    id: ProviderId,
    model_id: String,
    /// What the endpoint speaks.
    kind: EndpointKind,
    /// The body's `model`: the name the endpoint serves.
    served: String,
    authorization: Option<Redacted>,
    chat_url: String,
    health_url: String,
    /// The chat transport for `http://` servers; `None` for others (ureq, the `tls` feature).
    chat: Option<Arc<HttpClient>>,
    agent: ureq::Agent,
    health_agent: ureq::Agent,
    tokenizer: LlamaCppTokenizer,
    /// The base URL and HTTP settings, for a tokenizer found by the probe.
    base: String,
    options: HttpOptions,
}

const CHAT_PATH: &str = "/v1/chat/completions";

/// A header value that is never printed (an API key).
#[derive(Clone)]
struct Redacted(String);

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The first request setting that only llama-server has, if `config` uses one.
fn llama_only(config: &super::GenerationConfig) -> Option<&'static str> {
    let c = config;
    [
        ("grammar", c.grammar.is_some()),
        ("top_k", c.top_k.is_some()),
        ("min_p", c.min_p.is_some()),
        ("typical_p", c.typical_p.is_some()),
        ("repeat_penalty", c.repeat_penalty.is_some()),
        ("repeat_last_n", c.repeat_last_n.is_some()),
        ("mirostat", c.mirostat.is_some()),
        ("mirostat_tau", c.mirostat_tau.is_some()),
        ("mirostat_eta", c.mirostat_eta.is_some()),
    ]
    .into_iter()
    .find_map(|(name, set)| set.then_some(name))
}

impl LlamaCppInferenceProvider {
    /// A provider for `model_id` served at `base_url` (e.g. `http://127.0.0.1:10000`).
    pub fn new(model_id: &str, base_url: &str, options: &HttpOptions) -> Self {
        let base = base_url.trim_end_matches('/');
        let shared = agent(options);
        let health_agent = agent(&HttpOptions {
            read_timeout: options.health_timeout,
            ..options.clone()
        });
        let chat = Endpoint::parse(base).map(|e| {
            Arc::new(HttpClient::new(
                e,
                options.connect_timeout,
                options.read_timeout,
            ))
        });
        LlamaCppInferenceProvider {
            id: ProviderId::from_string(format!("llama-cpp:{model_id}")),
            model_id: model_id.to_owned(),
            kind: EndpointKind::LlamaServer,
            served: model_id.to_owned(),
            authorization: None,
            chat_url: format!("{base}{CHAT_PATH}"),
            health_url: format!("{base}/health"),
            tokenizer: LlamaCppTokenizer::new(base, options),
            chat,
            agent: shared,
            health_agent,
            base: base.to_owned(),
            options: options.clone(),
        }
    }

    /// A provider for `model_id` on an OpenAI-compatible engine at `base_url` (vLLM,
    /// SGLang, ...): requests name `served_model` (default `model_id`), carry `api_key` as
    /// `Authorization: Bearer` when given, and health is `GET /v1/models`. A request that needs
    /// what only llama-server has (a grammar, `top_k`, `min_p`, mirostat, ...) is
    /// [`InferenceError::Unsupported`] before anything is sent; so is tokenizing through this
    /// provider (a model loaded through the manager tokenizes when [`Self::probe`] finds
    /// `/tokenize`).
    pub fn openai(
        model_id: &str,
        base_url: &str,
        options: &HttpOptions,
        served_model: Option<&str>,
        api_key: Option<&str>,
    ) -> Self {
        let base = base_url.trim_end_matches('/');
        let mut p = Self::new(model_id, base, options).with_api_key(api_key, options);
        p.id = ProviderId::from_string(format!("openai:{model_id}"));
        p.kind = EndpointKind::Openai;
        p.served = served_model.unwrap_or(model_id).to_owned();
        p.health_url = format!("{base}/v1/models");
        p.tokenizer = LlamaCppTokenizer::unsupported(options);
        p
    }

    /// This provider sending `api_key` as `Authorization: Bearer` with every request (for a
    /// llama-server started with `--api-key`, or an engine that wants one); never printed.
    pub fn with_api_key(mut self, api_key: Option<&str>, options: &HttpOptions) -> Self {
        let authorization = api_key.map(|k| format!("Bearer {k}"));
        let base = self.chat_url.trim_end_matches(CHAT_PATH).to_owned();
        self.chat = Endpoint::parse(&base).map(|e| {
            Arc::new(
                HttpClient::new(e, options.connect_timeout, options.read_timeout)
                    .with_authorization(authorization.clone()),
            )
        });
        self.tokenizer.authorization = authorization.clone().map(Redacted);
        self.authorization = authorization.map(Redacted);
        self
    }

    /// A handle on this provider's tokenizer (sharing its connections and its key).
    pub(crate) fn tokenizer_handle(&self) -> LlamaCppTokenizer {
        self.tokenizer.clone()
    }

    /// What the endpoint speaks.
    pub fn kind(&self) -> EndpointKind {
        self.kind
    }

    /// Finds what the endpoint offers (after a healthy [`InferenceProvider::health_check`]).
    /// llama-server offers everything and is not asked. An `openai` endpoint is asked, each
    /// request at most 30 s (or the read timeout, if shorter), giving up when `cancel` is
    /// set: its `/v1/models` must list the served model; `/tokenize` is tried; a one-token
    /// streamed completion must end with `usage` (correx records every inference's counts),
    /// and one with a JSON-schema `response_format` says whether structured output is
    /// accepted (a 400, 422 or 501 says it is not). The endpoint's model then tokenizes
    /// through what the probe found.
    ///
    /// # Errors
    /// Why the endpoint cannot serve this model now: it does not list it, it does not answer
    /// a completion, its streams carry no usage, or a request failed otherwise (asked again
    /// later).
    pub fn probe(&self, cancel: &CancelToken) -> Result<EndpointFeatures, String> {
        if self.kind == EndpointKind::LlamaServer {
            return Ok(EndpointFeatures::LLAMA_SERVER);
        }
        let quick = self.for_probe();
        quick.probe_models()?;
        let tokenize = quick
            .probed_tokenizer()
            .is_some_and(|t| t.tokenize("correx").is_ok_and(|t| !t.is_empty()));
        let ask = |format: Option<ResponseFormat>| {
            let request = InferenceRequest {
                context: super::ContextPack {
                    system: None,
                    task: None,
                    entries: vec![super::ContextEntry::new(
                        super::SourceType::User,
                        "Answer with one word.",
                    )],
                },
                config: super::GenerationConfig {
                    max_tokens: 1,
                    temperature: 0.0,
                    response_format: format,
                    ..super::GenerationConfig::default()
                },
                session: None,
            };
            quick.infer_stream(&request, cancel, &mut |_| StreamControl::Continue)
        };
        match ask(None) {
            Ok(_) => {}
            Err(InferenceError::StreamIncomplete { .. }) => {
                return Err(
                    "its streamed completions carry no usage (stream_options.include_usage), \
                     which correx records for every inference"
                        .into(),
                )
            }
            Err(e) => return Err(format!("a one-token completion failed: {e}")),
        }
        let schema = ResponseFormat::JsonSchema {
            json_schema: super::contract::JsonSchemaFormat {
                name: Some("probe".into()),
                schema: json!({"type": "object"}),
                strict: None,
            },
        };
        let json_schema = match ask(Some(schema)) {
            Ok(_) => true,
            Err(InferenceError::Http {
                status: 400 | 422 | 501,
                ..
            }) => false,
            Err(e) => return Err(format!("a completion with a JSON schema failed: {e}")),
        };
        Ok(EndpointFeatures {
            tokenize,
            json_schema,
            llama_extras: false,
        })
    }

    /// This provider with every read bounded by [`PROBE_TIMEOUT`].
    fn for_probe(&self) -> Self {
        let options = HttpOptions {
            read_timeout: self.options.read_timeout.min(PROBE_TIMEOUT),
            tokenize_timeout: self.options.tokenize_timeout.min(PROBE_TIMEOUT),
            ..self.options.clone()
        };
        let authorization = self.authorization.as_ref().map(|Redacted(a)| a.clone());
        let mut p = self.clone();
        p.chat = Endpoint::parse(&self.base).map(|e| {
            Arc::new(
                HttpClient::new(e, options.connect_timeout, options.read_timeout)
                    .with_authorization(authorization),
            )
        });
        p.agent = agent(&options);
        p.options = options;
        p
    }

    /// `/v1/models` lists the served model.
    fn probe_models(&self) -> Result<(), String> {
        let url = format!("{}/v1/models", self.base);
        let mut get = self.health_agent.get(&url);
        if let Some(Redacted(a)) = &self.authorization {
            get = get.header("authorization", a);
        }
        let text = get
            .call()
            .map_err(|e| format!("listing its models: {}", transport(&url, e)))?
            .body_mut()
            .with_config()
            .limit(4 * 1024 * 1024)
            .read_to_string()
            .map_err(|e| format!("listing its models: {e}"))?;
        let listed: Vec<String> = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("data").and_then(Value::as_array).cloned())
            .ok_or_else(|| format!("/v1/models is not a model list: {}", prefix(&text)))?
            .iter()
            .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_owned))
            .collect();
        if listed.contains(&self.served) {
            return Ok(());
        }
        let mut shown: Vec<&str> = listed.iter().map(String::as_str).take(10).collect();
        if listed.len() > shown.len() {
            shown.push("...");
        }
        Err(format!(
            "it serves {}, not {:?} (set served_model to the name it serves)",
            if shown.is_empty() {
                "no model".to_owned()
            } else {
                shown.join(", ")
            },
            self.served
        ))
    }

    /// The tokenizer an `openai` endpoint may have (vLLM's `/tokenize`), sharing this
    /// provider's key; llama-server's for a llama-server.
    pub(crate) fn probed_tokenizer(&self) -> Option<LlamaCppTokenizer> {
        match self.kind {
            EndpointKind::LlamaServer => Some(self.tokenizer.clone()),
            EndpointKind::Openai => {
                let mut t = LlamaCppTokenizer::openai(&self.base, &self.options, &self.served);
                t.authorization = self.authorization.clone();
                Some(t)
            }
        }
    }

    /// The model id this provider asks for.
    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// Runs one completion, giving up when `cancel` is set (the connection closes, so the
    /// server stops generating).
    ///
    /// # Errors
    /// As [`InferenceProvider::infer_stream`].
    pub fn infer_with_cancel(
        &self,
        request: &InferenceRequest,
        cancel: &CancelToken,
    ) -> Result<InferenceResponse, InferenceError> {
        self.infer_stream(request, cancel, &mut |_| StreamControl::Continue)
    }

    /// Embeds `inputs` (`/v1/embeddings`), giving up when `cancel` is set. The server must
    /// have been started with `--embeddings`.
    ///
    /// # Errors
    /// [`InferenceError::InvalidInput`] before sending; connection, timeout and HTTP errors;
    /// [`InferenceError::MalformedBody`] for an answer that is not one vector per input.
    pub fn embed(
        &self,
        inputs: &[String],
        cancel: &CancelToken,
    ) -> Result<super::Embeddings, InferenceError> {
        use super::embedding;
        embedding::check_inputs(inputs)?;
        let request = embedding::body(&self.served, inputs);
        let body = request.to_string();
        let start = Instant::now();
        let value = match &self.chat {
            Some(client) => {
                let mut resp = client.post(embedding::EMBEDDINGS_PATH, body.as_bytes(), cancel)?;
                let mut text = Vec::new();
                let read = (&mut resp).take(256 * 1024 * 1024).read_to_end(&mut text);
                if let Err(e) = read {
                    return Err(if cancel.is_cancelled() {
                        InferenceError::Cancelled
                    } else {
                        InferenceError::Transport {
                            url: format!("{}{}", self.base, embedding::EMBEDDINGS_PATH),
                            detail: format!("reading the answer: {e}"),
                        }
                    });
                }
                let text = String::from_utf8_lossy(&text);
                if !(200..300).contains(&resp.status) {
                    return Err(http_error(resp.status, &text));
                }
                serde_json::from_str(&text).map_err(|e| InferenceError::MalformedBody {
                    detail: format!("not JSON: {e}"),
                    body_prefix: prefix(&text),
                })?
            }
            None => {
                if cancel.is_cancelled() {
                    return Err(InferenceError::Cancelled);
                }
                let url = format!("{}{}", self.base, embedding::EMBEDDINGS_PATH);
                let auth = self.authorization.as_ref().map(|Redacted(a)| a.as_str());
                post_json(&self.agent, &url, &request, auth)?
            }
        };
        embedding::parse(
            &value,
            inputs.len(),
            &self.model_id,
            start.elapsed().as_millis() as u64,
        )
    }

    /// Sends a chat body and reads its answer.
    fn send_chat(
        &self,
        body: &str,
        cancel: &CancelToken,
        on_chunk: &mut dyn FnMut(StreamChunk<'_>) -> StreamControl,
    ) -> Result<InferenceResponse, InferenceError> {
        let start = Instant::now();
        if let Some(client) = &self.chat {
            let resp = client.post(CHAT_PATH, body.as_bytes(), cancel)?;
            let (status, content_type) = (resp.status, resp.content_type.clone());
            return self.answer(status, &content_type, resp, cancel, on_chunk, start);
        }
        // Other schemes (https with the `tls` feature) go through ureq: a cancel is seen at the
        // next piece of the answer rather than at once.
        if cancel.is_cancelled() {
            return Err(InferenceError::Cancelled);
        }
        let mut post = self
            .agent
            .post(&self.chat_url)
            .header("content-type", "application/json");
        if let Some(Redacted(a)) = &self.authorization {
            post = post.header("authorization", a);
        }
        let resp = post
            .send(body.as_bytes())
            .map_err(|e| transport(&self.chat_url, e))?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        let reader = resp.into_body().into_reader();
        self.answer(status, &content_type, reader, cancel, on_chunk, start)
    }

    /// As [`InferenceProvider::infer_stream`] on llama-server slot `slot` (`id_slot`, with
    /// its prompt cache), so a conversation's prefix stays where it is reused.
    ///
    /// # Errors
    /// As [`InferenceProvider::infer_stream`].
    pub(crate) fn infer_stream_pinned(
        &self,
        request: &InferenceRequest,
        slot: u32,
        cancel: &CancelToken,
        on_chunk: &mut dyn FnMut(StreamChunk<'_>) -> StreamControl,
    ) -> Result<InferenceResponse, InferenceError> {
        let mut body = stream_body(&self.served, request);
        if let Some(obj) = body.as_object_mut() {
            obj.insert("id_slot".into(), json!(slot));
            obj.insert("cache_prompt".into(), json!(true));
        }
        self.send_chat(&body.to_string(), cancel, on_chunk)
    }

    /// llama-server's `POST /slots/{slot}?action=` `save` or `restore` of `filename` (in
    /// the server's `--slot-save-path`); the server's answer.
    ///
    /// # Errors
    /// Connection, timeout and HTTP errors (a server started without a save path answers
    /// 501).
    pub(crate) fn slot_action(
        &self,
        slot: u32,
        action: &str,
        filename: &str,
    ) -> Result<Value, InferenceError> {
        let url = format!("{}/slots/{slot}?action={action}", self.base);
        let auth = self.authorization.as_ref().map(|Redacted(a)| a.as_str());
        post_json(&self.agent, &url, &json!({"filename": filename}), auth)
    }

    /// How many slots the server runs (`/props` `total_slots`); `None` when it does not say.
    pub(crate) fn total_slots(&self) -> Option<u32> {
        let mut resp = self
            .health_agent
            .get(&format!("{}/props", self.base))
            .call()
            .ok()?;
        let body: Value = serde_json::from_str(&resp.body_mut().read_to_string().ok()?).ok()?;
        body.get("total_slots")?.as_u64().map(|n| n as u32)
    }

    /// An answer's body: an event stream, or one JSON object from a server that does not
    /// stream; an error status becomes the server's error.
    fn answer(
        &self,
        status: u16,
        content_type: &str,
        body: impl Read,
        cancel: &CancelToken,
        on_chunk: &mut dyn FnMut(StreamChunk<'_>) -> StreamControl,
        start: Instant,
    ) -> Result<InferenceResponse, InferenceError> {
        let read_all = |mut body: Box<dyn Read + '_>| -> Result<String, InferenceError> {
            let mut bytes = Vec::new();
            body.by_ref()
                .take(64 * 1024 * 1024)
                .read_to_end(&mut bytes)
                .map_err(|e| {
                    if cancel.is_cancelled() {
                        InferenceError::Cancelled
                    } else {
                        InferenceError::Transport {
                            url: self.chat_url.clone(),
                            detail: format!("reading the answer: {e}"),
                        }
                    }
                })?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        };
        if !(200..300).contains(&status) {
            let text = read_all(Box::new(body.take(1024 * 1024)))?;
            return Err(http_error(status, &text));
        }
        if content_type.starts_with("text/event-stream") {
            return read_events(
                BufReader::new(body),
                cancel,
                on_chunk,
                &self.chat_url,
                start,
                &self.model_id,
            );
        }
        let text = read_all(Box::new(body))?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| InferenceError::MalformedBody {
                detail: format!("not JSON: {e}"),
                body_prefix: prefix(&text),
            })?;
        let response =
            parse_chat_response(&value, start.elapsed().as_millis() as u64, &self.model_id)?;
        let chunk = StreamChunk {
            kind: super::ChunkKind::Text,
            text: &response.text,
        };
        if !response.text.is_empty() && on_chunk(chunk) == StreamControl::Stop {
            return Err(InferenceError::Cancelled);
        }
        Ok(response)
    }
}

/// Capabilities by model id: "coder" codes, "r1"/"deepseek" reason, anything else is general.
pub fn capabilities_for(model_id: &str) -> Vec<CapabilityScore> {
    let id = model_id.to_ascii_lowercase();
    let capability = if id.contains("coder") {
        (ModelCapability::Coding, 0.9)
    } else if id.contains("r1") || id.contains("deepseek") {
        (ModelCapability::Reasoning, 0.9)
    } else {
        (ModelCapability::General, 0.7)
    };
    vec![CapabilityScore {
        capability: capability.0,
        score: capability.1,
    }]
}

impl InferenceProvider for LlamaCppInferenceProvider {
    fn id(&self) -> &ProviderId {
        &self.id
    }

    fn infer(&self, request: &InferenceRequest) -> Result<InferenceResponse, InferenceError> {
        self.infer_with_cancel(request, &CancelToken::new())
    }

    fn infer_stream(
        &self,
        request: &InferenceRequest,
        cancel: &CancelToken,
        on_chunk: &mut dyn FnMut(StreamChunk<'_>) -> StreamControl,
    ) -> Result<InferenceResponse, InferenceError> {
        if self.kind == EndpointKind::Openai {
            if let Some(feature) = llama_only(&request.config) {
                return Err(InferenceError::Unsupported {
                    feature: feature.into(),
                    endpoint_kind: self.kind.as_str().into(),
                });
            }
        }
        let body = stream_body(&self.served, request).to_string();
        self.send_chat(&body, cancel, on_chunk)
    }

    fn health_check(&self) -> ProviderHealth {
        let mut get = self.health_agent.get(&self.health_url);
        if let Some(Redacted(a)) = &self.authorization {
            get = get.header("authorization", a);
        }
        match get.call() {
            Ok(mut resp) => {
                let status = resp.status().as_u16();
                if status == 200 {
                    return ProviderHealth::Healthy;
                }
                let body = resp.body_mut().read_to_string().unwrap_or_default();
                let reason = match status {
                    503 => format!("loading: {}", prefix(&body)),
                    s => format!("status {s}: {}", prefix(&body)),
                };
                ProviderHealth::Unhealthy { reason }
            }
            Err(e) => ProviderHealth::Unhealthy {
                reason: format!("unreachable: {}", transport(&self.health_url, e)),
            },
        }
    }

    fn capabilities(&self) -> Vec<CapabilityScore> {
        capabilities_for(&self.model_id)
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &self.tokenizer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::{ContextEntry, GenerationConfig};

    #[test]
    fn context_pack_maps_to_roles_and_empty_becomes_one_user_message() {
        assert_eq!(
            messages(&ContextPack::default()),
            vec![json!({"role": "user", "content": ""})]
        );
        let pack = ContextPack {
            system: Some("sys".into()),
            task: Some("task".into()),
            entries: vec![
                ContextEntry::new(SourceType::Model, "said"),
                ContextEntry::new(SourceType::Tool, "out"),
            ],
        };
        let msgs = messages(&pack);
        let roles: Vec<&str> = msgs.iter().filter_map(|m| m["role"].as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(msgs[2]["content"], "said");
    }

    #[test]
    fn generation_config_fields_map_to_the_body() {
        let req = InferenceRequest {
            context: ContextPack::default(),
            config: GenerationConfig {
                temperature: 0.0,
                top_p: 0.5,
                max_tokens: 7,
                stop: vec!["\n".into()],
                seed: Some(42),
                top_k: Some(5),
                repeat_penalty: Some(1.1),
                ..GenerationConfig::default()
            },
            session: None,
        };
        let b = chat_body("m", &req);
        assert_eq!(b["temperature"], 0.0);
        assert_eq!(b["top_p"], 0.5);
        assert_eq!(b["max_tokens"], 7);
        assert_eq!(b["stop"], json!(["\n"]));
        assert_eq!(b["seed"], 42);
        assert_eq!(b["stream"], false);
        assert_eq!(b["model"], "m");
        assert_eq!(
            (b["top_k"].as_u64(), b["repeat_penalty"].as_f64()),
            (Some(5), Some(1.1))
        );
        assert!(
            b.get("min_p").is_none(),
            "unset fields leave the server's default"
        );
        let s = stream_body("m", &req);
        assert_eq!(
            (
                s["stream"].as_bool(),
                s["stream_options"]["include_usage"].as_bool()
            ),
            (Some(true), Some(true))
        );
    }

    #[test]
    fn capabilities_follow_the_model_id() {
        assert_eq!(
            capabilities_for("qwen2.5-coder")[0].capability,
            ModelCapability::Coding
        );
        assert_eq!(
            capabilities_for("DeepSeek-R1")[0].capability,
            ModelCapability::Reasoning
        );
        assert_eq!(
            capabilities_for("gemma")[0].capability,
            ModelCapability::General
        );
    }

    #[test]
    fn context_errors_are_their_own_variant() {
        let body = r#"{"error":{"code":400,"message":"too long","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#;
        assert!(matches!(
            http_error(400, body),
            InferenceError::ContextExceeded {
                prompt_tokens: Some(5000),
                context_size: Some(4096),
                ..
            }
        ));
        assert!(matches!(
            http_error(500, "boom"),
            InferenceError::Http { status: 500, .. }
        ));
    }
}
