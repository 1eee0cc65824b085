//! What a saved cache belongs to: the model file (its SHA-256), the server build (the
//! binary's SHA-256) and the settings that shape the cache (context size, the server's extra
//! arguments, what it serves). A cache is only ever restored into a server with the same key;
//! the key's id names the directory that server saves into, and it is the only cache
//! directory that server can reach.

use crate::text::hex;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What a saved cache may be restored into.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CacheKey {
    /// SHA-256 of the GGUF file.
    pub model_digest: String,
    /// SHA-256 of the llama-server binary.
    pub build_digest: String,
    /// `--ctx-size`.
    pub context_size: u32,
    /// The descriptor's extra arguments (slots, cache types, SWA, ...), as given.
    pub args: Vec<String>,
    /// `chat` or `embeddings`.
    pub serves: String,
}

impl CacheKey {
    /// The key's name: 32 hex digits of the SHA-256 of its JSON.
    pub fn id(&self) -> String {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        hex(&Sha256::digest(&bytes)[..16])
    }

    /// Why a cache saved under `self` cannot go into a server of `other`, if it cannot: the
    /// first difference, in the order a user would look for it.
    pub fn mismatch(&self, other: &CacheKey) -> Option<&'static str> {
        if self.model_digest != other.model_digest {
            Some("model")
        } else if self.build_digest != other.build_digest {
            Some("build")
        } else if self != other {
            Some("settings")
        } else {
            None
        }
    }
}

/// File digests, remembered by the file's identity (device, inode, size, change time) in
/// memory and in `dir`, so a model file is read once, not at every load.
#[derive(Debug)]
pub(crate) struct Digests {
    dir: PathBuf,
    known: Mutex<HashMap<String, String>>,
}

impl Digests {
    pub fn new(dir: PathBuf) -> Digests {
        Digests {
            dir,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// The SHA-256 of `path`'s contents, in hex.
    ///
    /// # Errors
    /// The file cannot be read.
    pub fn of(&self, path: &Path) -> std::io::Result<String> {
        let m = std::fs::metadata(path)?;
        let identity = format!(
            "{}:{}:{}:{}.{}",
            m.dev(),
            m.ino(),
            m.size(),
            m.ctime(),
            m.ctime_nsec()
        );
        let name = hex(&Sha256::digest(identity.as_bytes())[..16]);
        if let Some(d) = self.known.lock().get(&name) {
            return Ok(d.clone());
        }
        let remembered = self.dir.join(&name);
        let digest = match std::fs::read_to_string(&remembered) {
            Ok(d) if d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()) => d,
            _ => {
                let d = sha256_file(path)?;
                // Only a speed-up: a digest that cannot be kept is computed again next time.
                let _ = crate::private_dir::write_atomic(&remembered, d.as_bytes());
                d
            }
        };
        self.known.lock().insert(name, digest.clone());
        Ok(digest)
    }
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CacheKey {
        CacheKey {
            model_digest: "m".into(),
            build_digest: "b".into(),
            context_size: 4096,
            args: vec![],
            serves: "chat".into(),
        }
    }

    #[test]
    fn every_part_of_the_key_changes_its_id_and_names_the_mismatch() {
        let k = key();
        assert_eq!(k.mismatch(&k), None);
        type Change = fn(&mut CacheKey);
        let changes: [(Change, &str); 5] = [
            (|k| k.model_digest = "n".into(), "model"),
            (|k| k.build_digest = "c".into(), "build"),
            (|k| k.context_size = 2048, "settings"),
            (
                |k| k.args = vec!["--parallel".into(), "2".into()],
                "settings",
            ),
            (|k| k.serves = "embeddings".into(), "settings"),
        ];
        for (change, reason) in changes {
            let mut other = key();
            change(&mut other);
            assert_ne!(other.id(), k.id());
            assert_eq!(k.mismatch(&other), Some(reason));
        }
    }

    #[test]
    fn a_digest_is_the_contents_and_follows_a_rewritten_file() {
        let dir =
            crate::private_dir::PrivateDir::new_in(&std::env::temp_dir(), "correx-cache-test-")
                .unwrap();
        let file = dir.path().join("model.gguf");
        std::fs::write(&file, b"abc").unwrap();
        let digests = Digests::new(dir.path().join("digests"));
        std::fs::create_dir(dir.path().join("digests")).unwrap();
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(digests.of(&file).unwrap(), abc);
        // Remembered on disk: a new table reads it back.
        assert_eq!(
            Digests::new(dir.path().join("digests")).of(&file).unwrap(),
            abc
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&file, b"abd").unwrap();
        assert_ne!(digests.of(&file).unwrap(), abc);
    }
}
