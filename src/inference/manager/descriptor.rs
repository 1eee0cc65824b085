//! What a model is ([`ModelDescriptor`], [`ResidencyMode`]) and what the manager says of it.

use super::*;

/// When a loaded model is unloaded without being asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResidencyMode {
    /// Never unloads by itself.
    Persistent,
    /// Unloads after `idle_timeout` with no inference in flight.
    Dynamic,
    /// Unloads as soon as no inference is in flight after one completes.
    Ephemeral,
}

/// What a model's server is started for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelRole {
    /// Chat completions (`infer`).
    #[default]
    Chat,
    /// Embeddings (`embed`): the server is started with `--embeddings` and, unless
    /// `extra_args` chooses one, `--pooling mean`.
    Embeddings,
}

impl ModelRole {
    /// The name in descriptors and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelRole::Chat => "chat",
            ModelRole::Embeddings => "embeddings",
        }
    }

    fn is_chat(&self) -> bool {
        *self == ModelRole::Chat
    }
}

/// A model the manager can load.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelDescriptor {
    /// The model's id; loading the same id again is a no-op unless the server would differ
    /// (see [`ModelDescriptor::same_server`]).
    pub model_id: String,
    /// The GGUF file; empty for a model served by [`ModelDescriptor::endpoints`].
    #[serde(default)]
    pub model_path: PathBuf,
    /// When it unloads by itself.
    pub residency: ResidencyMode,
    /// DYNAMIC's idle timeout; default 60 s.
    #[serde(
        default = "default_idle_ms",
        with = "duration_ms",
        rename = "idle_timeout_ms"
    )]
    pub idle_timeout: Duration,
    /// The server's context size; default 8192.
    #[serde(default = "default_ctx")]
    pub context_size: u32,
    /// Extra server arguments, e.g. `["--no-jinja", "--chat-template", "gemma"]`.
    #[serde(default)]
    pub extra_args: Vec<String>,
    /// Threads for generation; default: llama-server's own choice.
    #[serde(default)]
    pub threads: Option<u32>,
    /// URLs of llama-servers already running elsewhere (e.g. `http://10.0.0.5:8080`) that
    /// serve this model, instead of a `model_path` to spawn: nothing is spawned or killed;
    /// requests go to the healthy endpoint with the fewest in flight and fail over to the
    /// next when one stops answering. Such models take no slot of `max_loaded` and no memory
    /// budget.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<String>,
    /// What the endpoints speak; default `llama-server`.
    #[serde(default, skip_serializing_if = "EndpointKind::is_default")]
    pub endpoint_kind: EndpointKind,
    /// The environment variable holding the endpoints' API key, sent as `Authorization:
    /// Bearer`; the key is read when the model loads and never recorded, logged or quoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// The model name the endpoints serve (the body's `model`); default: `model_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_model: Option<String>,
    /// What its server is started for; default `chat`. An embedding model is a resident like
    /// any other (the same `max_loaded`, memory budget and eviction).
    #[serde(default, skip_serializing_if = "ModelRole::is_chat")]
    pub serves: ModelRole,
}

pub(super) fn default_idle_ms() -> Duration {
    Duration::from_secs(60)
}

pub(super) fn default_ctx() -> u32 {
    8192
}

mod duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

impl ModelDescriptor {
    /// Whether a server started for `self` serves `other` as it is: the same file, context
    /// size, threads and server arguments. Residency does not matter; a load that changes any
    /// of these restarts the server (recorded as `replaced`).
    pub fn same_server(&self, other: &ModelDescriptor) -> bool {
        self.model_path == other.model_path
            && self.context_size == other.context_size
            && self.threads == other.threads
            && self.extra_args == other.extra_args
            && self.endpoints == other.endpoints
            && self.endpoint_kind == other.endpoint_kind
            && self.api_key_env == other.api_key_env
            && self.served_model == other.served_model
            && self.serves == other.serves
    }

    /// Whether this model is served by running servers elsewhere rather than spawned.
    pub fn is_remote(&self) -> bool {
        !self.endpoints.is_empty()
    }

    /// Checks the descriptor before anything is spawned.
    ///
    /// # Errors
    /// [`ModelLoadError::InvalidDescriptor`] naming the problem.
    pub fn validate(&self) -> Result<(), ModelLoadError> {
        let bad = |detail: String| {
            Err(ModelLoadError::InvalidDescriptor {
                model_id: self.model_id.clone(),
                detail,
            })
        };
        if self.model_id.trim().is_empty() {
            return bad("model_id is empty".into());
        }
        let has_path = !self.model_path.as_os_str().is_empty();
        match (has_path, self.is_remote()) {
            (false, false) => return bad("give a model_path or endpoints".into()),
            (true, true) => {
                return bad("give a model_path or endpoints, not both".into());
            }
            _ => {}
        }
        for url in &self.endpoints {
            let rest = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"));
            if rest.is_none_or(|r| r.trim_end_matches('/').is_empty()) {
                return bad(format!(
                    "endpoint {url:?} is not an http:// or https:// URL"
                ));
            }
        }
        if self.context_size == 0 {
            return bad("context_size is 0".into());
        }
        if self.serves == ModelRole::Embeddings && self.is_remote() {
            return bad(
                "serves: embeddings is for a model_path correx starts; remote endpoints serve \
                 chat only"
                    .into(),
            );
        }
        let remote_only = self.endpoint_kind != EndpointKind::LlamaServer
            || self.api_key_env.is_some()
            || self.served_model.is_some();
        if remote_only && !self.is_remote() {
            return bad(
                "endpoint_kind, api_key_env and served_model are for a model served at endpoints"
                    .into(),
            );
        }
        if let Some(name) = &self.api_key_env {
            let valid = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            if !valid {
                return bad(format!(
                    "api_key_env {name:?} is not an environment variable name"
                ));
            }
            if std::env::var_os(name).is_none_or(|v| v.is_empty()) {
                return bad(format!(
                    "api_key_env names {name}, which is not set (or empty) in this process's \
                     environment"
                ));
            }
        }
        if self
            .served_model
            .as_deref()
            .is_some_and(|m| m.trim().is_empty())
        {
            return bad("served_model is empty".into());
        }
        Ok(())
    }

    /// A descriptor with the defaults (60 s idle timeout, 8192 context, no extra arguments).
    pub fn new(
        model_id: impl Into<String>,
        model_path: impl Into<PathBuf>,
        residency: ResidencyMode,
    ) -> Self {
        ModelDescriptor {
            model_id: model_id.into(),
            model_path: model_path.into(),
            residency,
            idle_timeout: default_idle_ms(),
            context_size: default_ctx(),
            extra_args: Vec::new(),
            threads: None,
            endpoints: Vec::new(),
            endpoint_kind: EndpointKind::LlamaServer,
            api_key_env: None,
            served_model: None,
            serves: ModelRole::Chat,
        }
    }

    /// A model served by llama-servers already running at `endpoints` (see
    /// [`ModelDescriptor::endpoints`]); PERSISTENT, since nothing is spawned.
    pub fn remote(model_id: impl Into<String>, endpoints: Vec<String>) -> Self {
        ModelDescriptor {
            endpoints,
            ..ModelDescriptor::new(model_id, PathBuf::new(), ResidencyMode::Persistent)
        }
    }
}

/// Whether a model's server is up or still starting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelState {
    /// Healthy and serving.
    Loaded,
    /// Its server is starting and not yet healthy.
    Loading,
    /// Its server is being stopped.
    Unloading,
}

/// One model in [`super::DefaultModelManager::status`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ModelStatus {
    /// The model's id.
    pub model_id: String,
    /// Loaded or loading.
    pub state: ModelState,
    /// The server's pid, once it serves (none for a remote model).
    pub pid: Option<u32>,
    /// The port it listens on (none for a remote model).
    pub port: Option<u16>,
    /// A remote model's endpoints, each with whether its last check passed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<EndpointStatus>,
    /// When it unloads by itself.
    pub residency: ResidencyMode,
    /// When it became healthy, in milliseconds since the Unix epoch.
    pub loaded_at_ms: Option<u64>,
    /// For a DYNAMIC model with nothing in flight: milliseconds until its idle unload.
    pub idle_expires_in_ms: Option<u64>,
    /// Inferences running on it.
    pub in_flight: u32,
    /// The server's resident memory, read from `/proc`.
    pub rss_bytes: Option<u64>,
    /// The memory estimated before loading (GGUF size plus KV cache); estimated only when
    /// the manager has a memory budget.
    pub estimated_bytes: Option<u64>,
}

/// One endpoint of a remote model in [`ModelStatus`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct EndpointStatus {
    /// Its URL.
    pub url: String,
    /// Whether its last health check or request succeeded.
    pub healthy: bool,
    /// Requests running on it.
    pub in_flight: u32,
}
