//! Ed25519 keys for checkpoints: the signing key stays with the host, the public key goes to
//! whoever checks.
//!
//! Both files hold 64 hex digits (a trailing newline allowed): the signing key file the
//! 32-byte secret seed, the public key file the 32-byte public key. `correx log keygen`
//! writes a new signing key (mode 0600, never over an existing file) and prints its public key.

use super::EvidenceError;
use crate::events::chain::{from_hex, to_hex};
use ed25519_dalek::{Signer, Verifier};
use std::fmt;
use std::io::{Read, Write};
use std::path::Path;

/// A host's Ed25519 signing key.
pub struct SigningKey(ed25519_dalek::SigningKey);

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningKey(redacted)")
    }
}

/// An Ed25519 public key: what a verifier is given.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(ed25519_dalek::VerifyingKey);

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_hex())
    }
}

fn read_hex32(path: &Path, what: &'static str) -> Result<[u8; 32], EvidenceError> {
    let text = std::fs::read_to_string(path).map_err(|source| EvidenceError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    from_hex(text.trim_end_matches(['\n', '\r'])).ok_or_else(|| EvidenceError::BadKey {
        path: path.to_path_buf(),
        detail: format!("{what} file holds 64 hex digits (32 bytes), and this one does not"),
    })
}

impl SigningKey {
    /// The key in the file at `path`.
    ///
    /// # Errors
    /// [`EvidenceError::Io`] when it cannot be read; [`EvidenceError::BadKey`] when it is not
    /// 64 hex digits.
    pub fn from_file(path: &Path) -> Result<SigningKey, EvidenceError> {
        let seed = read_hex32(path, "a signing key")?;
        Ok(SigningKey(ed25519_dalek::SigningKey::from_bytes(&seed)))
    }

    /// Writes a new random key to `path` (mode 0600; an existing file is never replaced) and
    /// returns it.
    ///
    /// # Errors
    /// [`EvidenceError::Io`] when the randomness or the file cannot be had.
    pub fn generate(path: &Path) -> Result<SigningKey, EvidenceError> {
        let io = |source| EvidenceError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut seed = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut r| r.read_exact(&mut seed))
            .map_err(|source| EvidenceError::Io {
                path: "/dev/urandom".into(),
                source,
            })?;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        f.write_all(format!("{}\n", to_hex(&seed)).as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(io)?;
        Ok(SigningKey(ed25519_dalek::SigningKey::from_bytes(&seed)))
    }

    /// Its public key.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    /// The signature of `message`, as 128 hex digits.
    pub fn sign_hex(&self, message: &[u8]) -> String {
        self.0
            .sign(message)
            .to_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl PublicKey {
    /// The key in the file at `path` (or, when `path` names no file and is 64 hex digits, the
    /// key those digits spell).
    ///
    /// # Errors
    /// [`EvidenceError::Io`], [`EvidenceError::BadKey`].
    pub fn from_file(path: &Path) -> Result<PublicKey, EvidenceError> {
        let bytes = match path.to_str().and_then(from_hex) {
            Some(b) if !path.exists() => b,
            _ => read_hex32(path, "a public key")?,
        };
        Self::from_bytes(&bytes).ok_or_else(|| EvidenceError::BadKey {
            path: path.to_path_buf(),
            detail: "these 32 bytes are not an Ed25519 public key".into(),
        })
    }

    /// The key these bytes are, if they are one.
    pub fn from_bytes(bytes: &[u8; 32]) -> Option<PublicKey> {
        ed25519_dalek::VerifyingKey::from_bytes(bytes)
            .ok()
            .map(PublicKey)
    }

    /// The key as 64 hex digits.
    pub fn to_hex(&self) -> String {
        to_hex(self.0.as_bytes())
    }

    /// Whether `signature_hex` (128 hex digits) is this key's signature of `message`.
    pub fn verifies(&self, message: &[u8], signature_hex: &str) -> bool {
        let Some(bytes) = hex64(signature_hex) else {
            return false;
        };
        let sig = ed25519_dalek::Signature::from_bytes(&bytes);
        self.0.verify_strict(message, &sig).is_ok() && self.0.verify(message, &sig).is_ok()
    }
}

fn hex64(text: &str) -> Option<[u8; 64]> {
    if text.len() != 128 || !text.is_ascii() {
        return None;
    }
    let (a, b) = (from_hex(&text[..64])?, from_hex(&text[64..])?);
    let mut out = [0u8; 64];
    out[..32].copy_from_slice(&a);
    out[32..].copy_from_slice(&b);
    Some(out)
}
