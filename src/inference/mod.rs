//! Inference: the model contracts and their llama.cpp implementation.

mod contract;
mod error;
mod llama;
mod manager;
mod manager_error;

pub use contract::{
    CapabilityScore, ContextEntry, ContextPack, FinishReason, GenerationConfig, InferenceProvider,
    InferenceRequest, InferenceResponse, ModelCapability, ProviderHealth, SourceType, TokenUsage,
    Tokenizer,
};
pub use error::InferenceError;
pub use llama::{
    capabilities_for, chat_body, HttpOptions, LlamaCppInferenceProvider, LlamaCppTokenizer,
};
pub use manager::{
    DefaultModelManager, ManagedInferenceProvider, ManagerOptions, ModelDescriptor, ModelManager,
    ResidencyMode, MODEL_STREAM,
};
pub use manager_error::ModelLoadError;
