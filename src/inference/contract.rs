//! The inference contracts: what a model is asked and what it answers.

use super::InferenceError;
use crate::cancel::CancelToken;
use crate::ids::ProviderId;
use serde::{Deserialize, Serialize};

/// Where an L2 context entry came from; decides its chat role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceType {
    /// Something the model said earlier: sent as `assistant`.
    Model,
    /// Something the user said: sent as `user`.
    User,
    /// A tool's output: sent as `user`.
    Tool,
}

/// One L2 entry: history or a tool's output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextEntry {
    /// Where the text came from.
    pub source: SourceType,
    /// The text.
    pub content: String,
    /// For a `model` entry: the tool calls the model made in that turn (sent as the assistant
    /// message's `tool_calls`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a `tool` entry: the id of the call this output answers; with it the entry is sent as
    /// a `tool` message, without it as `user` text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ContextEntry {
    /// An entry with text only.
    pub fn new(source: SourceType, content: impl Into<String>) -> Self {
        ContextEntry {
            source,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// The layered context of one request: L0 system, L1 task, L2 history and tool entries.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextPack {
    /// L0: the system prompt.
    #[serde(default)]
    pub system: Option<String>,
    /// L1: the task, sent as a user message.
    #[serde(default)]
    pub task: Option<String>,
    /// L2: history and tool entries, in order.
    #[serde(default)]
    pub entries: Vec<ContextEntry>,
}

impl ContextPack {
    /// Whether the pack holds nothing at all.
    pub fn is_empty(&self) -> bool {
        self.system.is_none() && self.task.is_none() && self.entries.is_empty()
    }
}

/// Sampling and output settings. Every `Option` left `None` is not sent, so the server's own
/// default applies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[serde(deny_unknown_fields)]
pub struct GenerationConfig {
    /// Sampling temperature; default 0.7.
    pub temperature: f64,
    /// Nucleus sampling mass; default 0.95.
    pub top_p: f64,
    /// Most tokens to generate; default 512.
    pub max_tokens: u32,
    /// Strings that end generation; default none.
    pub stop: Vec<String>,
    /// Sampling seed for repeatable output; default none.
    pub seed: Option<u64>,
    /// Sample from the k most likely tokens only (llama-server's default 40; 0 turns it off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Drop tokens less likely than this fraction of the most likely one (server default 0.05).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    /// Locally typical sampling mass (server default 1.0: off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub typical_p: Option<f64>,
    /// Penalty for repeating recent tokens (server default 1.0: off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeat_penalty: Option<f64>,
    /// How many recent tokens the repeat penalty looks at (server default 64; -1: the context).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeat_last_n: Option<i32>,
    /// OpenAI's presence penalty (server default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    /// OpenAI's frequency penalty (server default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    /// Mirostat sampling: 0 off, 1 or 2 (server default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirostat: Option<u8>,
    /// Mirostat's target entropy (server default 5.0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirostat_tau: Option<f64>,
    /// Mirostat's learning rate (server default 0.1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirostat_eta: Option<f64>,
    /// Constrains the answer: JSON, or JSON matching a schema.
    // Internally tagged: serde would read an array as the tag and the fields by position.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::strict_json::optional_object"
    )]
    pub response_format: Option<ResponseFormat>,
    /// Constrains the answer to a GBNF grammar; the server refuses it together with `tools`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
    /// Functions the model may call; needs a server started with `--jinja`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    /// Whether and which tool the model must call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        GenerationConfig {
            temperature: 0.7,
            top_p: 0.95,
            max_tokens: 512,
            stop: Vec::new(),
            seed: None,
            top_k: None,
            min_p: None,
            typical_p: None,
            repeat_penalty: None,
            repeat_last_n: None,
            presence_penalty: None,
            frequency_penalty: None,
            mirostat: None,
            mirostat_tau: None,
            mirostat_eta: None,
            response_format: None,
            grammar: None,
            tools: Vec::new(),
            tool_choice: None,
        }
    }
}

/// A constraint on the answer's form, in OpenAI's wire shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[serde(deny_unknown_fields)]
pub enum ResponseFormat {
    /// Free text (the default).
    Text,
    /// Any JSON object, or one matching `schema` when given (llama-server's extension).
    JsonObject {
        /// A JSON schema the object must match.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        schema: Option<serde_json::Value>,
    },
    /// JSON matching a schema.
    JsonSchema {
        /// The schema and its name.
        #[serde(deserialize_with = "crate::strict_json::object")]
        json_schema: JsonSchemaFormat,
    },
}

/// The schema of [`ResponseFormat::JsonSchema`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// A name for the schema (OpenAI requires one; llama-server ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The JSON schema.
    pub schema: serde_json::Value,
    /// OpenAI's strict flag; llama-server always constrains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// A function the model may call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// The function's name.
    pub name: String,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON schema of its arguments; default: an object with no declared properties.
    #[serde(default = "empty_object_schema")]
    pub parameters: serde_json::Value,
}

fn empty_object_schema() -> serde_json::Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// Whether the model must call a tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides (the default when tools are given).
    Auto,
    /// No tool call.
    None,
    /// At least one tool call.
    Required,
    /// This function: `{"function": "name"}`.
    Function(String),
}

/// A call the model asked for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The server's id of the call, to answer it with a `tool` entry's `tool_call_id`.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments: normally a JSON object; a JSON string holding the raw text when the model
    /// wrote arguments that are not valid JSON.
    pub arguments: serde_json::Value,
}

/// Which part of the answer a streamed piece belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkKind {
    /// The answer's text.
    Text,
    /// The model's reasoning, for models that think before answering.
    Reasoning,
}

/// One piece of a streamed answer, as it arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamChunk<'a> {
    /// Text or reasoning.
    pub kind: ChunkKind,
    /// The new text (a token or a few).
    pub text: &'a str,
}

/// What a stream callback wants next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamControl {
    /// Keep generating.
    Continue,
    /// Stop: the connection closes, the server stops decoding, and the call returns
    /// [`InferenceError::Cancelled`].
    Stop,
}

/// One inference request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InferenceRequest {
    /// What the model sees; required in JSON (`{}` is an empty pack).
    pub context: ContextPack,
    /// How it samples.
    #[serde(default)]
    pub config: GenerationConfig,
    /// A key for the conversation this request belongs to (a session id): a remote model
    /// sends every request of it to the same endpoint, where its prompt is cached, while that
    /// endpoint is healthy and not over `models.session_spill_in_flight` (placed by rendezvous
    /// hashing with bounded loads over the healthy endpoints). None: the endpoint with the
    /// fewest requests in flight.
    /// A local model with `models.prompt_cache` set runs it on a slot of its own and keeps its
    /// cache across evictions and restarts; other local models ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

// Token counts are recorded (`inference.completed`), so they live with what is recorded.
pub use crate::domain::TokenUsage;

/// Why generation stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end or a stop sequence.
    Stop,
    /// `max_tokens` or the context ran out.
    Length,
    /// The model asked for tool calls.
    ToolCalls,
    /// Anything else, kept as the server said it.
    Unknown(String),
}

impl FinishReason {
    /// Maps the server's string.
    pub fn from_server(s: &str) -> FinishReason {
        match s {
            "stop" => FinishReason::Stop,
            "length" => FinishReason::Length,
            "tool_calls" => FinishReason::ToolCalls,
            other => FinishReason::Unknown(other.to_owned()),
        }
    }

    /// The server's string for this reason.
    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::Unknown(s) => s,
        }
    }
}

/// One completion.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InferenceResponse {
    /// The generated text.
    pub text: String,
    /// Token counts, as the server reported them.
    pub usage: TokenUsage,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// Wall time of the HTTP call, in milliseconds.
    pub latency_ms: u64,
    /// The model that answered.
    pub model: String,
    /// The server's own `timings` object, when it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<serde_json::Value>,
    /// The tool calls the model made, in order (finish reason `tool_calls`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The model's reasoning, when the server separated it from the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The endpoint that answered, for a remote model; `None` for a local one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// Whether a provider can serve requests now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ProviderHealth {
    /// Ready.
    Healthy,
    /// Not ready; `reason` says why (loading, unreachable, a status code).
    Unhealthy {
        /// Why.
        reason: String,
    },
}

impl ProviderHealth {
    /// Whether this is healthy.
    pub fn is_healthy(&self) -> bool {
        matches!(self, ProviderHealth::Healthy)
    }
}

/// What a model is good at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelCapability {
    /// General chat and text.
    General,
    /// Writing and reading code.
    Coding,
    /// Multi-step reasoning.
    Reasoning,
}

/// A capability with a score in 0..=1.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CapabilityScore {
    /// The capability.
    pub capability: ModelCapability,
    /// How good, 0..=1.
    pub score: f64,
}

/// Counts tokens the way a model does. Blocking, shared across threads.
pub trait Tokenizer: Send + Sync {
    /// The model's token ids for `text`.
    ///
    /// # Errors
    /// When the tokenizer cannot be reached or answers nonsense.
    fn tokenize(&self, text: &str) -> Result<Vec<i64>, InferenceError>;

    /// How many tokens `text` is. Never fails: when the tokenizer is unreachable it approximates
    /// (characters / 4) and logs a warning.
    fn count(&self, text: &str) -> usize;
}

/// A model that answers requests. Blocking, shared across threads.
pub trait InferenceProvider: Send + Sync {
    /// The provider's id.
    fn id(&self) -> &ProviderId;
    /// Runs one completion.
    ///
    /// # Errors
    /// Connection, timeout, HTTP and body errors, as [`InferenceError`] variants.
    fn infer(&self, request: &InferenceRequest) -> Result<InferenceResponse, InferenceError>;
    /// Runs one completion, handing each piece of the answer to `on_chunk` as it arrives, on
    /// the calling thread. A cancel of `cancel` or [`StreamControl::Stop`] ends the call with
    /// [`InferenceError::Cancelled`]. Returns what [`InferenceProvider::infer`] returns.
    ///
    /// The default runs [`InferenceProvider::infer`] and hands its whole text over once.
    ///
    /// # Errors
    /// As [`InferenceProvider::infer`], plus the stream errors ([`InferenceError::StreamInterrupted`],
    /// [`InferenceError::MalformedEvent`], [`InferenceError::StreamIncomplete`]).
    fn infer_stream(
        &self,
        request: &InferenceRequest,
        cancel: &CancelToken,
        on_chunk: &mut dyn FnMut(StreamChunk<'_>) -> StreamControl,
    ) -> Result<InferenceResponse, InferenceError> {
        if cancel.is_cancelled() {
            return Err(InferenceError::Cancelled);
        }
        let response = self.infer(request)?;
        let chunk = StreamChunk {
            kind: ChunkKind::Text,
            text: &response.text,
        };
        if cancel.is_cancelled()
            || (!response.text.is_empty() && on_chunk(chunk) == StreamControl::Stop)
        {
            return Err(InferenceError::Cancelled);
        }
        Ok(response)
    }
    /// Whether the provider can serve requests now.
    fn health_check(&self) -> ProviderHealth;
    /// What the model is good at.
    fn capabilities(&self) -> Vec<CapabilityScore>;
    /// The model's tokenizer.
    fn tokenizer(&self) -> &dyn Tokenizer;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<InferenceRequest, serde_json::Error> {
        serde_json::from_str(text)
    }

    #[test]
    fn requests_refuse_unknown_fields_and_name_a_missing_context() {
        let missing = parse("{}").unwrap_err().to_string();
        assert!(missing.contains("missing field `context`"), "{missing}");
        assert!(parse(r#"{"context": {}}"#).is_ok());
        for bad in [
            r#"{"context": {}, "extra": 1}"#,
            r#"{"context": {"sytem": "x"}}"#,
            r#"{"context": {"entries": [{"source": "user", "content": "x", "role": "user"}]}}"#,
            r#"{"context": {}, "config": {"temprature": 0}}"#,
            r#"{"context": {}, "config": {"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "nmae": "x"}}}}"#,
            r#"{"context": {}, "config": {"tools": [{"name": "f", "params": {}}]}}"#,
            r#"{"context": {}, "config": {"tool_choice": "sometimes"}}"#,
        ] {
            assert!(parse(bad).is_err(), "accepted {bad}");
        }
        let ok = parse(
            r#"{"context": {"task": "x"}, "config": {"top_k": 5, "response_format": {"type": "json_object"}, "tool_choice": {"function": "f"}, "tools": [{"name": "f"}]}}"#,
        )
        .unwrap();
        assert_eq!(ok.config.top_k, Some(5));
        assert_eq!(
            ok.config.tool_choice,
            Some(ToolChoice::Function("f".into()))
        );
        assert_eq!(ok.config.tools[0].parameters["type"], "object");
    }
}
