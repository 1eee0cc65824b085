use std::fmt;

/// What went wrong talking to a model server.
#[derive(Debug)]
#[non_exhaustive]
pub enum InferenceError {
    /// Nothing listens at the server's address.
    ConnectionRefused {
        /// The URL called.
        url: String,
        /// The transport's account.
        detail: String,
    },
    /// The server did not answer in time.
    Timeout {
        /// The URL called.
        url: String,
        /// The transport's account.
        detail: String,
    },
    /// Any other transport failure (reset, DNS, I/O).
    Transport {
        /// The URL called.
        url: String,
        /// The transport's account.
        detail: String,
    },
    /// The server answered with a non-2xx status.
    Http {
        /// The HTTP status.
        status: u16,
        /// The server's own error message, or the start of its body.
        message: String,
    },
    /// The prompt does not fit the model's context (HTTP 400 `exceed_context_size_error`);
    /// retrying the same request cannot help.
    ContextExceeded {
        /// The server's message.
        message: String,
        /// Prompt tokens, when the server said.
        prompt_tokens: Option<u64>,
        /// Context size, when the server said.
        context_size: Option<u64>,
    },
    /// The server answered 2xx with a body that is not the expected JSON.
    MalformedBody {
        /// What is wrong.
        detail: String,
        /// The start of the body.
        body_prefix: String,
    },
    /// The call was cancelled by the caller (a cancel token, or a stream callback that asked to
    /// stop); the connection was closed, so the server stopped generating.
    Cancelled,
    /// The connection broke in the middle of a streamed answer: the server died or was killed,
    /// or the network failed.
    StreamInterrupted {
        /// The URL called.
        url: String,
        /// How many events had arrived.
        events: u64,
        /// The transport's account.
        detail: String,
    },
    /// A line of the event stream is not a server-sent event this client understands.
    MalformedEvent {
        /// What is wrong.
        detail: String,
        /// The start of the line.
        line_prefix: String,
    },
    /// The stream ended cleanly but without the final event (the finish reason and usage).
    StreamIncomplete {
        /// What was missing.
        detail: String,
        /// How many events had arrived.
        events: u64,
    },
    /// No model is loaded, or it could not be loaded.
    ModelUnavailable {
        /// Why.
        detail: String,
    },
    /// The request needs what its endpoint does not have (a GBNF grammar, a llama-server
    /// sampling extra, tokenizing, on an `openai` endpoint); nothing was sent.
    Unsupported {
        /// What the request needs, e.g. `grammar`.
        feature: String,
        /// The endpoint's kind, e.g. `openai`.
        endpoint_kind: String,
    },
    /// The model's server was not started for this kind of call (an embedding asked of a
    /// chat model, a chat of an embedding model); nothing was sent.
    NotServed {
        /// The model.
        model_id: String,
        /// What the call needs: `chat` or `embeddings`.
        needs: String,
        /// What the model's descriptor says it serves.
        serves: String,
    },
    /// The call's input is wrong (no texts, an empty one, too many); nothing was sent.
    InvalidInput {
        /// What is wrong.
        detail: String,
    },
}

impl InferenceError {
    /// Whether the same request may succeed when retried later.
    pub fn is_transient(&self) -> bool {
        match self {
            InferenceError::ConnectionRefused { .. }
            | InferenceError::Timeout { .. }
            | InferenceError::Transport { .. }
            | InferenceError::ModelUnavailable { .. }
            | InferenceError::StreamInterrupted { .. } => true,
            InferenceError::Http { status, .. } => *status >= 500 || *status == 429,
            InferenceError::ContextExceeded { .. }
            | InferenceError::MalformedBody { .. }
            | InferenceError::MalformedEvent { .. }
            | InferenceError::StreamIncomplete { .. }
            | InferenceError::Unsupported { .. }
            | InferenceError::NotServed { .. }
            | InferenceError::InvalidInput { .. }
            | InferenceError::Cancelled => false,
        }
    }
}

impl fmt::Display for InferenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InferenceError::ConnectionRefused { url, detail } => write!(
                f,
                "connection to {url} refused ({detail}); is llama-server running and loaded?"
            ),
            InferenceError::Timeout { url, detail } => write!(
                f,
                "{url} did not answer in time ({detail}); raise the read timeout or lower max_tokens"
            ),
            InferenceError::Transport { url, detail } => write!(f, "calling {url} failed: {detail}"),
            InferenceError::Http { status, message } => {
                write!(f, "llama-server answered HTTP {status}: {message}")
            }
            InferenceError::ContextExceeded {
                message,
                prompt_tokens,
                context_size,
            } => {
                write!(f, "the prompt does not fit the context: {message}")?;
                if let (Some(p), Some(c)) = (prompt_tokens, context_size) {
                    write!(f, " ({p} prompt tokens, context {c})")?;
                }
                write!(f, "; shorten the context or load the model with a larger context size")
            }
            InferenceError::MalformedBody {
                detail,
                body_prefix,
            } => write!(f, "llama-server sent a malformed body: {detail}; body starts {body_prefix:?}"),
            InferenceError::Cancelled => f.write_str("the call was cancelled"),
            InferenceError::StreamInterrupted { url, events, detail } => write!(
                f,
                "the answer from {url} broke off after {events} events ({detail}); check that llama-server is still running (its log says why it stopped) and retry"
            ),
            InferenceError::MalformedEvent {
                detail,
                line_prefix,
            } => write!(
                f,
                "the server sent a malformed stream event: {detail}; line starts {line_prefix:?}; is the URL an OpenAI-compatible chat endpoint?"
            ),
            InferenceError::StreamIncomplete { detail, events } => write!(
                f,
                "the stream ended after {events} events without its final event ({detail}); the server may not support usage in streams (stream_options.include_usage)"
            ),
            InferenceError::ModelUnavailable { detail } => {
                write!(f, "no model available: {detail}")
            }
            InferenceError::Unsupported {
                feature,
                endpoint_kind,
            } => write!(
                f,
                "{feature} is not available on an {endpoint_kind} endpoint; nothing was sent \
                 (drop it from the request, or serve the model with llama-server)"
            ),
            InferenceError::NotServed {
                model_id,
                needs,
                serves,
            } => write!(
                f,
                "{model_id} serves {serves}, not {needs}; nothing was sent (load a model whose \
                 descriptor says \"serves\": \"{needs}\")"
            ),
            InferenceError::InvalidInput { detail } => {
                write!(f, "invalid input: {detail}; nothing was sent")
            }
        }
    }
}

impl std::error::Error for InferenceError {}

impl From<crate::http::HttpError> for InferenceError {
    fn from(e: crate::http::HttpError) -> Self {
        use crate::http::HttpError;
        match e {
            HttpError::ConnectionRefused { url, detail } => {
                InferenceError::ConnectionRefused { url, detail }
            }
            HttpError::Timeout { url, detail } => InferenceError::Timeout { url, detail },
            HttpError::Transport { url, detail } => InferenceError::Transport { url, detail },
            HttpError::Cancelled => InferenceError::Cancelled,
        }
    }
}
