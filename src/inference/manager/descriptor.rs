//! What a model is ([`ModelDescriptor`], [`ResidencyMode`]) and how the manager runs servers
//! ([`ManagerOptions`]).

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

/// A model the manager can load.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelDescriptor {
    /// The model's id; loading the same id again is a no-op unless the server would differ
    /// (see [`ModelDescriptor::same_server`]).
    pub model_id: String,
    /// The GGUF file.
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
        }
    }
}

/// Settings of a [`DefaultModelManager`].
#[derive(Clone, Debug)]
pub struct ManagerOptions {
    /// The llama-server binary; default `llama-server` as found by [`crate::LlamaInstall`].
    pub server_bin: PathBuf,
    /// Address the server binds; default `127.0.0.1`.
    pub host: String,
    /// Port the server binds; default 10000.
    pub port: u16,
    /// How long a load waits for `/health`; default 30 s.
    pub health_timeout: Duration,
    /// How long replacing or unloading a model waits for its running inferences to finish
    /// (they are never killed); after it the call fails with [`ModelLoadError::Busy`].
    /// Default 120 s.
    pub drain_timeout: Duration,
    /// Where `llama-server.log` goes; default `$XDG_DATA_HOME/correx/logs`
    /// (`~/.local/share/correx/logs`).
    pub log_dir: Option<PathBuf>,
    /// HTTP timeouts of the provider.
    pub http: HttpOptions,
}

impl Default for ManagerOptions {
    fn default() -> Self {
        ManagerOptions {
            server_bin: crate::LlamaInstall::locate()
                .map(|i| i.server)
                .unwrap_or_else(|| PathBuf::from("llama-server")),
            host: "127.0.0.1".into(),
            port: 10000,
            health_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(120),
            log_dir: None,
            http: HttpOptions::default(),
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
}

/// One model in [`super::DefaultModelManager::status`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ModelStatus {
    /// The model's id.
    pub model_id: String,
    /// Loaded or loading.
    pub state: ModelState,
    /// The server's pid, once it serves.
    pub pid: Option<u32>,
    /// The port it listens on.
    pub port: u16,
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
}
