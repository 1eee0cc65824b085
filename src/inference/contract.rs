//! The inference contracts: what a model is asked and what it answers.

use super::InferenceError;
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
pub struct ContextEntry {
    /// Where the text came from.
    pub source: SourceType,
    /// The text.
    pub content: String,
}

/// The layered context of one request: L0 system, L1 task, L2 history and tool entries.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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

/// Sampling settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
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
}

impl Default for GenerationConfig {
    fn default() -> Self {
        GenerationConfig {
            temperature: 0.7,
            top_p: 0.95,
            max_tokens: 512,
            stop: Vec::new(),
            seed: None,
        }
    }
}

/// One inference request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InferenceRequest {
    /// What the model sees.
    #[serde(default)]
    pub context: ContextPack,
    /// How it samples.
    #[serde(default)]
    pub config: GenerationConfig,
}

/// Token counts of one completion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    /// Tokens in the prompt.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// Their sum.
    pub total_tokens: u32,
}

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
    /// Whether the provider can serve requests now.
    fn health_check(&self) -> ProviderHealth;
    /// What the model is good at.
    fn capabilities(&self) -> Vec<CapabilityScore>;
    /// The model's tokenizer.
    fn tokenizer(&self) -> &dyn Tokenizer;
}
