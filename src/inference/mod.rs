//! Inference: the model contracts and their llama.cpp implementation.

mod contract;
mod error;
mod llama;

pub use contract::{
    CapabilityScore, ContextEntry, ContextPack, FinishReason, GenerationConfig, InferenceProvider,
    InferenceRequest, InferenceResponse, ModelCapability, ProviderHealth, SourceType, TokenUsage,
    Tokenizer,
};
pub use error::InferenceError;
pub use llama::{
    capabilities_for, chat_body, HttpOptions, LlamaCppInferenceProvider, LlamaCppTokenizer,
};
