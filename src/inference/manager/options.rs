//! [`ManagerOptions`]: how the manager runs servers, and its config section (`models`).

use super::{HttpOptions, ServerIsolation};
use crate::settings::{self, ConfigError, Section};
use serde::{Deserialize, Deserializer};
use std::path::PathBuf;
use std::time::Duration;

/// Settings of a [`DefaultModelManager`](super::DefaultModelManager) (config `models`). In the config each duration is
/// in milliseconds (`health_timeout_ms`), the budget in MiB (`memory_budget_mb`), and
/// `read_timeout_ms` sets [`HttpOptions::read_timeout`]; `host` and the other HTTP timeouts
/// are not configurable there.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ManagerOptions {
    /// The llama-server binary; default `llama-server` as found by [`crate::install::LlamaInstall`].
    pub server_bin: PathBuf,
    /// Address the servers bind; default `127.0.0.1`.
    #[serde(skip)]
    pub host: String,
    /// The first port of the range servers bind, default 10000: each loaded model gets the
    /// first port of `port..port + port_count` that no other model of this manager uses and
    /// nothing else listens on. 0: a free port chosen by the kernel for each (from Rust only:
    /// the config refuses 0).
    pub port: u16,
    /// How many ports the range has; default 16.
    pub port_count: u16,
    /// How many spawned models may be resident at once (servers starting or stopping count);
    /// default 1. A load beyond it first evicts the least recently used model with nothing in
    /// flight, else waits (see `max_queued`).
    pub max_loaded: usize,
    /// Memory the resident servers may use (config: mebibytes; held here in bytes); default
    /// none. Decisions use each loaded server's measured RSS (from `/proc`, its estimate while
    /// that is unknown) plus the estimate for the model to load: the GGUF size plus its KV
    /// cache at the context size, read from the file's metadata.
    #[serde(rename = "memory_budget_mb", deserialize_with = "settings::mebibytes")]
    pub memory_budget: Option<u64>,
    /// How many loads may wait at once for a model to become evictable; a load beyond it
    /// fails at once with [`ModelLoadError::Busy`](crate::inference::ModelLoadError::Busy). Default 16.
    pub max_queued: usize,
    /// How often loaded servers are health-checked (each check waits at most
    /// `http.health_timeout`); default 5 s. A spawned server that fails 3 checks in a row is
    /// killed and recorded as `unresponsive`, and loads again on its next use; a remote
    /// endpoint that fails one is skipped until it passes again.
    #[serde(rename = "liveness_interval_ms", with = "settings::millis")]
    pub liveness_interval: Duration,
    /// How long a load waits for `/health`; default 30 s.
    #[serde(rename = "health_timeout_ms", with = "settings::millis")]
    pub health_timeout: Duration,
    /// How long replacing, evicting or unloading a model waits for its running inferences to
    /// finish (they are never killed), and how long a queued load waits for a slot; after it
    /// the call fails with [`ModelLoadError::Busy`](crate::inference::ModelLoadError::Busy). Default 120 s.
    #[serde(rename = "drain_timeout_ms", with = "settings::millis")]
    pub drain_timeout: Duration,
    /// A remote model's requests of one session stay on the session's endpoint until it has
    /// this many requests in flight; beyond, they go to the least loaded; default 4.
    #[serde(rename = "session_spill_in_flight")]
    pub session_spill_in_flight: u32,
    /// How long a server being stopped gets after SIGTERM to exit before SIGKILL; default
    /// 1.5 s.
    #[serde(rename = "stop_grace_ms", with = "settings::millis")]
    pub stop_grace: Duration,
    /// Where `llama-server.log` goes; default `$XDG_DATA_HOME/correx/logs`
    /// (`~/.local/share/correx/logs`).
    pub log_dir: Option<PathBuf>,
    /// HTTP timeouts of the provider.
    #[serde(rename = "read_timeout_ms", deserialize_with = "read_timeout")]
    pub http: HttpOptions,
    /// How spawned servers are confined; default [`ServerIsolation::Default`].
    pub isolation: ServerIsolation,
    /// Sessions' prompt caches saved and restored across evictions and restarts; off unless
    /// set (config: an object, `{}` for its defaults).
    pub prompt_cache: Option<PromptCacheOptions>,
}

/// Where and how much of sessions' prompt caches (their slots' KV caches) a manager keeps
/// (config `models.prompt_cache`). Sizes are mebibytes in the config, bytes here.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PromptCacheOptions {
    /// The directory (made mode 0700, refused if another user can enter it); default
    /// `$XDG_CACHE_HOME/correx/prompt-cache` (`~/.cache/correx/prompt-cache`).
    pub dir: Option<PathBuf>,
    /// Bytes of saved caches per model (its file, build and settings; config: MiB); default
    /// 2 GiB. The least recently used go first.
    #[serde(rename = "max_mb_per_model", deserialize_with = "mib")]
    pub max_bytes_per_model: u64,
    /// Bytes of saved caches in all (config: MiB); default 8 GiB.
    #[serde(rename = "max_mb", deserialize_with = "mib")]
    pub max_bytes: u64,
    /// Sessions whose caches are kept per model; default 32.
    pub sessions_per_model: usize,
}

impl Default for PromptCacheOptions {
    fn default() -> Self {
        PromptCacheOptions {
            dir: None,
            max_bytes_per_model: 2 << 30,
            max_bytes: 8 << 30,
            sessions_per_model: 32,
        }
    }
}

impl PromptCacheOptions {
    /// The directory caches go to.
    pub fn dir(&self) -> PathBuf {
        self.dir.clone().unwrap_or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .unwrap_or_else(std::env::temp_dir)
                .join("correx/prompt-cache")
        })
    }

    fn check(&self) -> Result<(), ConfigError> {
        let under = |e: ConfigError| e.under("prompt_cache");
        if let Some(dir) = &self.dir {
            settings::non_empty("dir", dir).map_err(under)?;
        }
        settings::positive("max_mb_per_model", self.max_bytes_per_model).map_err(under)?;
        settings::positive("max_mb", self.max_bytes).map_err(under)?;
        settings::positive("sessions_per_model", self.sessions_per_model as u64).map_err(under)
    }
}

/// A size in MiB (`null` is absent: the default).
fn mib<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    u64::deserialize(d).map(|mb| mb.saturating_mul(1 << 20))
}

impl Default for ManagerOptions {
    fn default() -> Self {
        ManagerOptions {
            server_bin: crate::install::LlamaInstall::locate()
                .map(|i| i.server)
                .unwrap_or_else(|| PathBuf::from("llama-server")),
            host: "127.0.0.1".into(),
            port: 10000,
            port_count: 16,
            max_loaded: 1,
            memory_budget: None,
            max_queued: 16,
            liveness_interval: Duration::from_secs(5),
            health_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(120),
            session_spill_in_flight: 4,
            stop_grace: Duration::from_millis(1500),
            log_dir: None,
            http: HttpOptions::default(),
            isolation: ServerIsolation::default(),
            prompt_cache: None,
        }
    }
}

/// `read_timeout_ms`: the HTTP settings with that read timeout, the others their defaults.
fn read_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<HttpOptions, D::Error> {
    settings::millis::deserialize(d).map(|read_timeout| HttpOptions {
        read_timeout,
        ..HttpOptions::default()
    })
}

impl Section for ManagerOptions {
    fn validate(&self) -> Result<(), ConfigError> {
        self.check(false)
    }
}

impl ManagerOptions {
    /// Every check but the config's refusal of port 0 (from Rust, 0 asks the kernel for a
    /// free port): what the manager itself is built with.
    pub(crate) fn check_values(&self) -> Result<(), ConfigError> {
        self.check(true)
    }

    /// The section's checks, in the config's order; `port_zero` allows port 0.
    fn check(&self, port_zero: bool) -> Result<(), ConfigError> {
        settings::non_empty("server_bin", &self.server_bin)?;
        if !port_zero {
            settings::check(self.port != 0, "port", "0 is not a port (1-65535)")?;
        }
        settings::positive("port_count", u64::from(self.port_count))?;
        settings::positive("max_loaded", self.max_loaded as u64)?;
        if let Some(bytes) = self.memory_budget {
            settings::positive("memory_budget_mb", bytes)?;
        }
        settings::positive_ms("liveness_interval_ms", self.liveness_interval)?;
        settings::positive_ms("health_timeout_ms", self.health_timeout)?;
        settings::positive_ms("drain_timeout_ms", self.drain_timeout)?;
        settings::positive_ms("stop_grace_ms", self.stop_grace)?;
        settings::positive(
            "session_spill_in_flight",
            u64::from(self.session_spill_in_flight),
        )?;
        settings::positive_ms("read_timeout_ms", self.http.read_timeout)?;
        if let Some(dir) = &self.log_dir {
            settings::non_empty("log_dir", dir)?;
        }
        if let Some(cache) = &self.prompt_cache {
            cache.check()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: serde_json::Value) -> Result<ManagerOptions, ConfigError> {
        settings::read("models", Some(v))
    }

    #[test]
    fn the_prompt_cache_section_takes_defaults_and_refuses_what_cannot_work() {
        assert!(read(json!({})).unwrap().prompt_cache.is_none());
        let on = read(json!({"prompt_cache": {}}))
            .unwrap()
            .prompt_cache
            .unwrap();
        assert_eq!(on.max_bytes, 8 << 30);
        let sized = read(json!({"prompt_cache": {"max_mb_per_model": 3}})).unwrap();
        assert_eq!(sized.prompt_cache.unwrap().max_bytes_per_model, 3 << 20);
        let zero = read(json!({"prompt_cache": {"max_mb": 0}})).unwrap_err();
        assert_eq!(zero.field, "models.prompt_cache.max_mb");
        for bad in [
            json!({"prompt_cache": []}),
            json!({"prompt_cache": {"sessions": 3}}),
            json!({"prompt_cache": {"dir": ""}}),
        ] {
            let e = read(bad.clone()).unwrap_err();
            assert!(e.field.starts_with("models.prompt_cache"), "{bad}: {e}");
        }
    }
}
