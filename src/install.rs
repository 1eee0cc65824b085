//! Finding the llama-server binary and the model that `scripts/install-llama.sh` installed.

use std::path::PathBuf;

/// Where llama-server and the default GGUF model live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlamaInstall {
    /// The llama-server binary.
    pub server: PathBuf,
    /// The Gemma 3 270M Q4_K_M GGUF.
    pub model: PathBuf,
}

impl LlamaInstall {
    /// The SHA-256 of the model `scripts/install-llama.sh` installs (the script checks it too).
    pub const MODEL_SHA256: &'static str =
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
    /// Its size in bytes.
    pub const MODEL_BYTES: u64 = 253_113_024;

    /// The install named by `CORREX_LLAMA_SERVER` and `CORREX_MODEL`, else the one recorded by
    /// the install script in `$CORREX_CACHE/env` (default `~/.cache/correx/env`). `None` when
    /// neither exists on disk.
    pub fn locate() -> Option<LlamaInstall> {
        let from_env = std::env::var_os("CORREX_LLAMA_SERVER")
            .zip(std::env::var_os("CORREX_MODEL"))
            .map(|(s, m)| LlamaInstall {
                server: s.into(),
                model: m.into(),
            });
        from_env
            .or_else(Self::from_cache)
            .filter(|i| i.server.is_file() && i.model.is_file())
    }

    /// The cache directory the install script uses.
    pub fn cache_dir() -> Option<PathBuf> {
        std::env::var_os("CORREX_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("correx")))
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/correx")))
    }

    fn from_cache() -> Option<LlamaInstall> {
        let text = std::fs::read_to_string(Self::cache_dir()?.join("env")).ok()?;
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                .map(PathBuf::from)
        };
        Some(LlamaInstall {
            server: get("llama_server")?,
            model: get("model")?,
        })
    }
}
