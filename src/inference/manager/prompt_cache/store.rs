//! The cache directory (mode 0700, correx's own):
//! - `<key id>/<session>.bin`: what a server saved of a session's slot; a server is granted
//!   its own key's directory only, so it can neither read nor overwrite another model's;
//! - `sessions/<session>.json`: what each session's latest save holds (its key, the digests
//!   of the messages the slot was filled with, its token counts);
//! - `digests/`: model and server file digests, remembered by file identity.
//!
//! A session's name on disk is a digest of its id, so no id can name a path.

use super::key::CacheKey;
use crate::inference::manager::PromptCacheOptions;
use crate::text::hex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What one session's latest save holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Record {
    pub session: String,
    pub model_id: String,
    pub key: CacheKey,
    /// Digests of what fills the slot: the request's tools, then each message.
    pub prefix: Vec<String>,
    /// Prompt tokens of the request the slot was filled by.
    pub prompt_tokens: u32,
    /// Tokens the server saved (the prompt and the answer).
    pub tokens: u32,
    pub bytes: u64,
    pub saved_at_ms: u64,
}

/// A file that was removed to keep the caps, for the log.
#[derive(Debug)]
pub(crate) struct Removed {
    pub key_id: String,
    pub bytes: u64,
}

#[derive(Debug)]
pub(crate) struct Store {
    dir: PathBuf,
}

fn make_private(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    crate::private_dir::check_private(dir)
}

/// The on-disk name of a session.
pub(crate) fn session_name(session: &str) -> String {
    hex(&Sha256::digest(session.as_bytes())[..16])
}

fn is_key_id(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Store {
    /// Opens (making it if missing) the cache directory.
    ///
    /// # Errors
    /// It cannot be made, or another user could enter it.
    pub fn open(dir: PathBuf) -> io::Result<Store> {
        make_private(&dir)?;
        make_private(&dir.join("sessions"))?;
        make_private(&dir.join("digests"))?;
        Ok(Store { dir })
    }

    pub fn digests_dir(&self) -> PathBuf {
        self.dir.join("digests")
    }

    /// The directory servers of `key` save into, made if missing.
    ///
    /// # Errors
    /// It cannot be made or is not private.
    pub fn key_dir(&self, key: &CacheKey) -> io::Result<PathBuf> {
        let dir = self.dir.join(key.id());
        make_private(&dir)?;
        Ok(dir)
    }

    /// The file a session's slot is saved to, inside its key's directory.
    pub fn file_name(session: &str) -> String {
        format!("{}.bin", session_name(session))
    }

    fn record_path(&self, session: &str) -> PathBuf {
        self.dir
            .join("sessions")
            .join(format!("{}.json", session_name(session)))
    }

    fn bin_path(&self, key: &CacheKey, session: &str) -> PathBuf {
        self.dir.join(key.id()).join(Self::file_name(session))
    }

    /// The session's latest save, if its file is still there.
    pub fn record(&self, session: &str) -> Option<Record> {
        let text = std::fs::read(self.record_path(session)).ok()?;
        let record: Record = serde_json::from_slice(&text).ok()?;
        if record.session != session || !self.bin_path(&record.key, session).is_file() {
            return None;
        }
        Some(record)
    }

    /// Records a save the server just made.
    ///
    /// # Errors
    /// The record cannot be written.
    pub fn put(&self, mut record: Record) -> io::Result<()> {
        record.saved_at_ms = now_ms();
        let bytes = serde_json::to_vec(&record).map_err(io::Error::other)?;
        crate::private_dir::write_atomic(&self.record_path(&record.session), &bytes)
    }

    /// Marks a session's file used (the caps keep the most recently used).
    pub fn touch(&self, record: &Record) {
        let path = self.bin_path(&record.key, &record.session);
        if let Ok(f) = std::fs::File::options().write(true).open(path) {
            let _ = f.set_modified(SystemTime::now());
        }
    }

    /// Removes a session's saved cache under `key` (and its record, if it is that save's).
    pub fn remove(&self, key: &CacheKey, session: &str) {
        let _ = std::fs::remove_file(self.bin_path(key, session));
        if self.record(session).is_none_or(|r| r.key.id() == key.id()) {
            let _ = std::fs::remove_file(self.record_path(session));
        }
    }

    /// Removes the least recently used files until each key holds at most
    /// `sessions_per_model` files and `max_bytes_per_model` bytes, and all of them at most
    /// `max_bytes`.
    pub fn enforce(&self, caps: &PromptCacheOptions) -> Vec<Removed> {
        let mut files: Vec<(String, PathBuf, u64, SystemTime)> = Vec::new();
        for dir in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let name = dir.file_name().to_string_lossy().into_owned();
            if !is_key_id(&name) {
                continue;
            }
            for f in std::fs::read_dir(dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let Ok(m) = f.metadata() else { continue };
                if !m.is_file() || !f.file_name().to_string_lossy().ends_with(".bin") {
                    continue;
                }
                let used = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                files.push((name.clone(), f.path(), m.len(), used));
            }
        }
        // Newest first: what is kept is a prefix of each key's list and of the whole list.
        files.sort_by_key(|f| std::cmp::Reverse(f.3));
        let mut removed = Vec::new();
        let mut per_key: std::collections::HashMap<String, (usize, u64)> = Default::default();
        let mut total = 0u64;
        for (key_id, path, bytes, _) in files {
            let (count, sum) = per_key.entry(key_id.clone()).or_default();
            let keep = *count < caps.sessions_per_model
                && *sum + bytes <= caps.max_bytes_per_model
                && total + bytes <= caps.max_bytes;
            if keep {
                *count += 1;
                *sum += bytes;
                total += bytes;
                continue;
            }
            if std::fs::remove_file(&path).is_ok() {
                self.forget(&key_id, &path);
                removed.push(Removed { key_id, bytes });
            }
        }
        removed
    }

    /// Removes the record of the save at `path` (under `key_id`), if it is that save's.
    fn forget(&self, key_id: &str, path: &Path) {
        let Some(stem) = path.file_stem().map(|s| s.to_string_lossy().into_owned()) else {
            return;
        };
        let record = self.dir.join("sessions").join(format!("{stem}.json"));
        let points_here = std::fs::read(&record)
            .ok()
            .and_then(|t| serde_json::from_slice::<Record>(&t).ok())
            .is_none_or(|r| r.key.id() == key_id);
        if points_here {
            let _ = std::fs::remove_file(record);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(model: &str) -> CacheKey {
        CacheKey {
            model_digest: model.into(),
            build_digest: "b".into(),
            context_size: 4096,
            args: vec![],
            serves: "chat".into(),
        }
    }

    fn save(store: &Store, key: &CacheKey, session: &str, bytes: usize) {
        let dir = store.key_dir(key).unwrap();
        std::fs::write(dir.join(Store::file_name(session)), vec![0u8; bytes]).unwrap();
        store
            .put(Record {
                session: session.into(),
                model_id: "m".into(),
                key: key.clone(),
                prefix: vec![],
                prompt_tokens: 1,
                tokens: 1,
                bytes: bytes as u64,
                saved_at_ms: 0,
            })
            .unwrap();
        // Distinct modification times, in save order.
        std::thread::sleep(std::time::Duration::from_millis(15));
    }

    #[test]
    fn the_caps_remove_the_least_recently_used_with_their_records() {
        let root =
            crate::private_dir::PrivateDir::new_in(&std::env::temp_dir(), "correx-cache-test-")
                .unwrap();
        let store = Store::open(root.path().join("cache")).unwrap();
        let (a, b) = (key("a"), key("b"));
        for s in ["s1", "s2", "s3"] {
            save(&store, &a, s, 100);
        }
        save(&store, &b, "t1", 100);
        // s1 used again: s2 is now the oldest of a.
        let s1 = store.record("s1").unwrap();
        store.touch(&s1);
        let caps = PromptCacheOptions {
            sessions_per_model: 2,
            ..PromptCacheOptions::default()
        };
        let removed = store.enforce(&caps);
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].key_id, a.id());
        assert!(store.record("s2").is_none(), "its record went with it");
        assert!(store.record("s1").is_some() && store.record("s3").is_some());
        // In all: 250 bytes keeps the two newest files.
        let caps = PromptCacheOptions {
            max_bytes: 250,
            ..PromptCacheOptions::default()
        };
        assert_eq!(store.enforce(&caps).len(), 1);
        assert!(store.record("s3").is_none());
        assert!(store.record("s1").is_some() && store.record("t1").is_some());
    }

    #[test]
    fn a_record_without_its_file_or_for_another_session_is_no_save() {
        let root =
            crate::private_dir::PrivateDir::new_in(&std::env::temp_dir(), "correx-cache-test-")
                .unwrap();
        let store = Store::open(root.path().join("cache")).unwrap();
        let k = key("a");
        save(&store, &k, "s1", 10);
        assert!(store.record("s1").is_some());
        std::fs::remove_file(store.bin_path(&k, "s1")).unwrap();
        assert!(store.record("s1").is_none());
        assert!(store.record("s2").is_none());
    }

    #[test]
    fn a_directory_others_can_enter_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let root =
            crate::private_dir::PrivateDir::new_in(&std::env::temp_dir(), "correx-cache-test-")
                .unwrap();
        let dir = root.path().join("cache");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            Store::open(dir).unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
    }
}
