//! Inference: the model contracts and their llama.cpp implementation.

mod contract;
mod embedding;
mod error;
mod llama;
mod manager;
mod manager_error;
mod stream;

pub use contract::{
    CapabilityScore, ChunkKind, ContextEntry, ContextPack, FinishReason, GenerationConfig,
    InferenceProvider, InferenceRequest, InferenceResponse, JsonSchemaFormat, ModelCapability,
    ProviderHealth, ResponseFormat, SourceType, StreamChunk, StreamControl, TokenUsage, Tokenizer,
    ToolCall, ToolChoice, ToolSpec,
};
pub use embedding::Embeddings;
pub use error::InferenceError;
pub use llama::{
    capabilities_for, chat_body, stream_body, EndpointFeatures, EndpointKind, HttpOptions,
    LlamaCppInferenceProvider, LlamaCppTokenizer,
};
pub use manager::{
    DefaultModelManager, ManagedInferenceProvider, ManagerOptions, ModelDescriptor, ModelManager,
    ModelRole, ModelState, ModelStatus, PromptCacheOptions, ResidencyMode, ServerIsolation,
    MODEL_STREAM,
};
pub use manager_error::ModelLoadError;
