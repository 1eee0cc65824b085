//! Seals: the chain's head (position and hash) at a moment, kept outside the log, optionally
//! signed with the host's HMAC-SHA256 key.
//!
//! The chain alone shows an edit made without recomputing the hashes after it. Whoever can
//! write the file can also recompute them, or cut the tail, or put back an older copy; a seal
//! kept elsewhere catches those: `verify` against a seal finds the log shorter than the seal
//! (cut or rolled back) or holding another hash at the sealed position (rewritten).
//!
//! A seal file holds one seal per line, each a JSON object:
//! `{"correx_seal": 1, "position": N, "hash": "<64 hex>", "sealed_at_ms": T, "hmac_sha256": "<64 hex>"}`
//! (`hmac_sha256` only when signed: the HMAC of `correx.seal.v1\n{position}\n{hash}\n{sealed_at_ms}`
//! under the key). [`SealWriter`] appends to one, periodically.

use super::chain::{from_hex, to_hex, ChainHash};
use super::sqlite::SqliteEventStore;
use super::time::now_ms;
use super::EventStoreError;
use hmac::{Hmac, Mac};
use parking_lot::{Condvar, Mutex};
use sha2::Sha256;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The head of the chain at a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seal {
    /// The last event's position when sealed (0: the log was empty).
    pub position: u64,
    /// Its hash (zeros for an empty log).
    pub hash: ChainHash,
    /// When the seal was made, milliseconds since the Unix epoch.
    pub sealed_at_ms: i64,
    /// Whether the seal was read with a key and its signature matched (`false` for a seal made
    /// here: signing happens as it is written, in [`Seal::to_line`]).
    pub signed: bool,
}

/// What went wrong making, writing or reading seals.
#[derive(Debug)]
#[non_exhaustive]
pub enum SealError {
    /// The log's last event has no well-formed hash (it predates the chain, an older correx
    /// wrote it, or it was damaged): nothing to seal until the next append chains it.
    Unchained {
        /// That event's position.
        position: u64,
    },
    /// Reading the log failed.
    Store(EventStoreError),
    /// A seal or key file could not be read or written.
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A line of a seal file is not a seal.
    Malformed {
        /// Its line number, from 1.
        line: usize,
        /// What is wrong.
        detail: String,
    },
    /// A seal is unsigned, or its signature does not match the key: it was not made with this
    /// key, or it was changed.
    BadSignature {
        /// Its line number, from 1.
        line: usize,
        /// Unsigned, or signed with another key or changed.
        detail: &'static str,
    },
    /// The key file is empty.
    EmptyKey {
        /// The file.
        path: PathBuf,
    },
    /// An Ed25519 checkpoint could not be made or its key read.
    Checkpoint(super::evidence::EvidenceError),
}

impl fmt::Display for SealError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SealError::Unchained { position } => write!(
                f,
                "the log's last event (position {position}) has no hash (it predates the \
                 chain, an older correx wrote it, or its hash is damaged: `correx log verify` \
                 tells which); the next append chains it: append, then seal"
            ),
            SealError::Store(e) => write!(f, "{e}"),
            SealError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            SealError::Malformed { line, detail } => {
                write!(f, "seal line {line} is not a seal: {detail}")
            }
            SealError::BadSignature { line, detail } => write!(f, "seal line {line}: {detail}"),
            SealError::EmptyKey { path } => {
                write!(f, "{}: the key file is empty", path.display())
            }
            SealError::Checkpoint(e) => write!(f, "an Ed25519 checkpoint: {e}"),
        }
    }
}

impl std::error::Error for SealError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SealError::Store(e) => Some(e),
            SealError::Io { source, .. } => Some(source),
            SealError::Checkpoint(e) => Some(e),
            _ => None,
        }
    }
}

/// A host's key for signing seals: the bytes of a file, as they are.
#[derive(Clone)]
pub struct SealKey(Vec<u8>);

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealKey(redacted)")
    }
}

impl SealKey {
    /// The key in `bytes`.
    ///
    /// # Errors
    /// [`SealError::EmptyKey`] for no bytes (`path` names where they came from).
    pub fn new(bytes: Vec<u8>, path: &Path) -> Result<Self, SealError> {
        if bytes.is_empty() {
            return Err(SealError::EmptyKey {
                path: path.to_path_buf(),
            });
        }
        Ok(SealKey(bytes))
    }

    /// The key in the file at `path`, every byte of it (a trailing newline included).
    ///
    /// # Errors
    /// [`SealError::Io`] when it cannot be read; [`SealError::EmptyKey`] when it is empty.
    pub fn from_file(path: &Path) -> Result<Self, SealError> {
        let bytes = std::fs::read(path).map_err(|source| SealError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::new(bytes, path)
    }

    fn mac(&self, seal: &Seal) -> Hmac<Sha256> {
        // An HMAC takes a key of any length: `new_from_slice` cannot fail for it.
        let mut mac = match Hmac::<Sha256>::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts keys of every length"),
        };
        mac.update(seal.message().as_bytes());
        mac
    }
}

impl Seal {
    fn message(&self) -> String {
        format!(
            "correx.seal.v1\n{}\n{}\n{}",
            self.position,
            to_hex(&self.hash),
            self.sealed_at_ms
        )
    }

    /// The seal as one line of a seal file (no newline), signed when `key` is given.
    pub fn to_line(&self, key: Option<&SealKey>) -> String {
        let mut v = serde_json::json!({
            "correx_seal": 1,
            "position": self.position,
            "hash": to_hex(&self.hash),
            "sealed_at_ms": self.sealed_at_ms,
        });
        if let Some(key) = key {
            v["hmac_sha256"] = to_hex(&key.mac(self).finalize().into_bytes().into()).into();
        }
        v.to_string()
    }

    /// The seals in a seal file's text, in file order; blank lines are skipped. With `key`,
    /// every seal must carry a valid signature.
    ///
    /// # Errors
    /// [`SealError::Malformed`] or [`SealError::BadSignature`] naming the line.
    pub fn parse_all(text: &str, key: Option<&SealKey>) -> Result<Vec<Seal>, SealError> {
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            out.push(Self::parse(line, i + 1, key)?);
        }
        Ok(out)
    }

    fn parse(text: &str, line: usize, key: Option<&SealKey>) -> Result<Seal, SealError> {
        let bad = |detail: String| SealError::Malformed { line, detail };
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let Some(o) = v.as_object() else {
            return Err(bad(format!("a seal is a JSON object, not {v}")));
        };
        if o.get("correx_seal").and_then(|v| v.as_u64()) != Some(1) {
            return Err(bad("no \"correx_seal\": 1".into()));
        }
        let number = |name: &str| {
            o.get(name)
                .and_then(|v| v.as_u64())
                .ok_or_else(|| bad(format!("{name:?} is not a whole number")))
        };
        let hex = |name: &str| {
            o.get(name)
                .and_then(|v| v.as_str())
                .and_then(from_hex)
                .ok_or_else(|| bad(format!("{name:?} is not 64 hex digits")))
        };
        let mut seal = Seal {
            position: number("position")?,
            hash: hex("hash")?,
            sealed_at_ms: o
                .get("sealed_at_ms")
                .and_then(|v| v.as_i64())
                .ok_or_else(|| bad("\"sealed_at_ms\" is not a whole number".into()))?,
            signed: false,
        };
        if let Some(key) = key {
            let Some(given) = o.get("hmac_sha256") else {
                return Err(SealError::BadSignature {
                    line,
                    detail: "unsigned, but a key was given: every seal must be signed with it",
                });
            };
            let given = given
                .as_str()
                .and_then(from_hex)
                .ok_or_else(|| bad("\"hmac_sha256\" is not 64 hex digits".into()))?;
            key.mac(&seal)
                .verify_slice(&given)
                .map_err(|_| SealError::BadSignature {
                    line,
                    detail: "the signature does not match: signed with another key, or changed",
                })?;
            seal.signed = true;
        }
        Ok(seal)
    }

    /// Reads the seal file at `path`.
    ///
    /// # Errors
    /// [`SealError::Io`], or as [`Seal::parse_all`].
    pub fn read_file(path: &Path, key: Option<&SealKey>) -> Result<Vec<Seal>, SealError> {
        let text = std::fs::read_to_string(path).map_err(|source| SealError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse_all(&text, key)
    }

    /// Appends this seal as a line to `path` (created if missing) and flushes it to disk.
    ///
    /// # Errors
    /// [`SealError::Io`].
    pub fn append_to(&self, path: &Path, key: Option<&SealKey>) -> Result<(), SealError> {
        let io = |source| SealError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        // One write of the whole line: appends from two writers do not interleave.
        f.write_all(format!("{}\n", self.to_line(key)).as_bytes())
            .map_err(io)?;
        f.sync_data().map_err(io)
    }
}

impl Seal {
    /// A seal of the log file at `path` as it stands, read without writing to it.
    ///
    /// # Errors
    /// As [`SqliteEventStore::seal`]; [`EventStoreError::NotALog`] (in [`SealError::Store`])
    /// when the file is not a correx log.
    pub fn of_log(path: &Path) -> Result<Seal, SealError> {
        let conn = super::verify::open_log_read_only(path).map_err(SealError::Store)?;
        let head = super::sqlite::read_chain_head(&conn).map_err(SealError::Store)?;
        Self::of_head(head)
    }

    pub(crate) fn of_head((position, hash): (u64, Option<ChainHash>)) -> Result<Seal, SealError> {
        let hash = match (position, hash) {
            (0, _) => super::chain::GENESIS,
            (_, Some(h)) => h,
            (position, None) => return Err(SealError::Unchained { position }),
        };
        Ok(Seal {
            position,
            hash,
            sealed_at_ms: now_ms(),
            signed: false,
        })
    }
}

impl SqliteEventStore {
    /// A seal of the log as it stands: its last event's position and hash.
    ///
    /// # Errors
    /// [`SealError::Unchained`] when the last event predates the chain; [`SealError::Store`]
    /// when the log cannot be read.
    pub fn seal(&self) -> Result<Seal, SealError> {
        Seal::of_head(self.chain_head().map_err(SealError::Store)?)
    }
}

/// Where and how often a [`SealWriter`] seals.
#[derive(Clone, Debug)]
pub struct SealOptions {
    /// The seal file, appended to.
    pub file: PathBuf,
    /// How often to seal when the log has grown (at least every 10 ms).
    pub every: Duration,
    /// The key to sign with, if any.
    pub key: Option<SealKey>,
    /// Write Ed25519-signed checkpoints (as `correx log seal --signing-key` does) with this
    /// key instead of seals; a SQLite log only.
    pub signing: Option<Arc<super::evidence::SigningKey>>,
}

struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

/// Seals a log to a file every [`SealOptions::every`] while it grows, and once more when
/// dropped. A seal that cannot be written is reported with `log::warn!` and tried again next
/// time; the log's appenders never wait for it.
pub struct SealWriter {
    stop: Arc<Stop>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl fmt::Debug for SealWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealWriter").finish_non_exhaustive()
    }
}

impl SealWriter {
    /// Starts sealing `store` as `options` say; the first seal is written now.
    ///
    /// # Errors
    /// [`SealError`] when the first seal cannot be made or written (an unchained log is not an
    /// error: its first seal comes after the next append).
    pub fn start(store: Arc<super::EventLog>, options: SealOptions) -> Result<Self, SealError> {
        let mut last = None;
        let mut options = options;
        options.every = options.every.max(Duration::from_millis(10));
        seal_once(&store, &options, &mut last)?;
        let stop = Arc::new(Stop {
            stopped: Mutex::new(false),
            wake: Condvar::new(),
        });
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("correx-seal".into())
                .spawn(move || loop {
                    let stopped = {
                        let mut s = stop.stopped.lock();
                        if !*s {
                            stop.wake.wait_for(&mut s, options.every);
                        }
                        *s
                    };
                    if let Err(e) = seal_once(&store, &options, &mut last) {
                        log::warn!("correx: sealing the log failed: {e}");
                    }
                    if stopped {
                        return;
                    }
                })
                .map_err(|source| SealError::Io {
                    path: PathBuf::from("<seal thread>"),
                    source,
                })?
        };
        Ok(SealWriter {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for SealWriter {
    /// Writes a last seal and stops.
    fn drop(&mut self) {
        *self.stop.stopped.lock() = true;
        self.stop.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Seals once if the log moved since `last`.
fn seal_once(
    store: &super::EventLog,
    options: &SealOptions,
    last: &mut Option<u64>,
) -> Result<(), SealError> {
    let seal = match store.seal() {
        Ok(s) => s,
        // A log from before the chain: its first seal comes after the next append. (Should
        // its last event lack a hash later, an older correx appended it: `verify` names it.)
        Err(SealError::Unchained { position }) => {
            if *last != Some(position) {
                log::warn!(
                    "correx: not sealing yet: the log's last event (position {position}) has no \
                     hash; the next append chains it"
                );
                *last = Some(position);
            }
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    if *last == Some(seal.position) {
        return Ok(());
    }
    match &options.signing {
        None => seal.append_to(&options.file, options.key.as_ref())?,
        // An empty log has no tree to sign yet: its first checkpoint follows its first event.
        Some(_) if seal.position == 0 => return Ok(()),
        Some(key) => {
            let sqlite = store.as_sqlite().ok_or_else(|| {
                SealError::Checkpoint(super::evidence::EvidenceError::Log(
                    "Ed25519 checkpoints are made of SQLite logs; this log is on PostgreSQL: \
                     use key_file (HMAC seals) there"
                        .into(),
                ))
            })?;
            let checkpoint =
                super::evidence::checkpoint_of_log(sqlite.path()).map_err(SealError::Checkpoint)?;
            append_line(&options.file, &checkpoint.to_json(key).to_string())?;
        }
    }
    *last = Some(seal.position);
    Ok(())
}

/// Appends `text` and a newline to `path`, synced.
fn append_line(path: &Path, text: &str) -> Result<(), SealError> {
    use std::io::Write;
    let io = |source| SealError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    f.write_all(format!("{text}\n").as_bytes())
        .and_then(|()| f.sync_data())
        .map_err(io)
}

/// The runtime config's `seal` section: `{"file": "/var/lib/me/log.seals", "interval_ms":
/// 60000, "key_file": "/etc/me/seal.key"}`, or with `"signing_key_file":
/// "/etc/me/log.ed25519"` (from `correx log keygen`) signed checkpoints instead of seals.
/// Without `file`, nothing is sealed.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SealConfig {
    /// The seal file; absent: no seals.
    pub file: Option<PathBuf>,
    /// How often to seal while the log grows (milliseconds in the config); default 60 s.
    #[serde(
        rename = "interval_ms",
        deserialize_with = "crate::settings::millis::deserialize"
    )]
    pub every: Duration,
    /// The file whose bytes sign each seal (HMAC-SHA256), if any.
    pub key_file: Option<PathBuf>,
    /// An Ed25519 key file (`correx log keygen`): each seal is then a signed checkpoint (log
    /// id, position, head hash, Merkle tree size and root), checked with `correx log verify
    /// --seal FILE --public-key KEY`; a SQLite log only, and not with `key_file`.
    pub signing_key_file: Option<PathBuf>,
}

impl Default for SealConfig {
    fn default() -> Self {
        SealConfig {
            file: None,
            every: Duration::from_secs(60),
            key_file: None,
            signing_key_file: None,
        }
    }
}

impl crate::settings::Section for SealConfig {
    fn validate(&self) -> Result<(), crate::settings::ConfigError> {
        use crate::settings::{absolute, check, positive_ms};
        positive_ms("interval_ms", self.every)?;
        absolute("file", self.file.as_slice())?;
        absolute("key_file", self.key_file.as_slice())?;
        absolute("signing_key_file", self.signing_key_file.as_slice())?;
        check(
            self.file.is_some() || self.key_file.is_none(),
            "key_file",
            "signs seals, but no seal file is set: add \"file\"",
        )?;
        check(
            self.file.is_some() || self.signing_key_file.is_none(),
            "signing_key_file",
            "signs checkpoints, but no seal file is set: add \"file\"",
        )?;
        check(
            self.key_file.is_none() || self.signing_key_file.is_none(),
            "signing_key_file",
            "key_file signs HMAC seals, signing_key_file Ed25519 checkpoints: give one",
        )
    }
}

impl SealConfig {
    /// The options a [`SealWriter`] takes, the key read from its file; `None` when no file is
    /// set.
    ///
    /// # Errors
    /// As [`SealKey::from_file`].
    pub fn options(&self) -> Result<Option<SealOptions>, SealError> {
        let Some(file) = &self.file else {
            return Ok(None);
        };
        Ok(Some(SealOptions {
            file: file.clone(),
            every: self.every,
            key: self
                .key_file
                .as_deref()
                .map(SealKey::from_file)
                .transpose()?,
            signing: self
                .signing_key_file
                .as_deref()
                .map(|p| super::evidence::SigningKey::from_file(p).map(Arc::new))
                .transpose()
                .map_err(SealError::Checkpoint)?,
        }))
    }
}
