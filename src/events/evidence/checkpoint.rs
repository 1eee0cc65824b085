//! Checkpoints: a signed statement of a log's state (its id, the last position and chain hash,
//! the Merkle tree's size and root, the time) that anyone with the public key can check, and
//! a host can publish or timestamp elsewhere.
//!
//! One checkpoint per line, a JSON object:
//! `{"correx_checkpoint": 1, "log_id": "<64 hex>", "position": N, "hash": "<64 hex>",
//! "tree_size": T, "root": "<64 hex>", "sealed_at_ms": M, "ed25519": "<128 hex>"}`, where
//! `ed25519` signs `correx.checkpoint.v1\n{log_id}\n{position}\n{hash}\n{tree_size}\n{root}\n
//! {sealed_at_ms}` (each number in decimal, each hash in lowercase hex). A log's id is the
//! chain hash of its first chained event: two logs never share one.

use super::keys::{PublicKey, SigningKey};
use super::EvidenceError;
use crate::events::chain::{from_hex, to_hex, ChainHash};
use crate::events::seal::Seal;

/// A log's state at a moment, as a signed checkpoint states it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The log's id: its first chained event's hash.
    pub log_id: ChainHash,
    /// The last event's position.
    pub position: u64,
    /// Its chain hash.
    pub hash: ChainHash,
    /// How many chained events the tree holds.
    pub tree_size: u64,
    /// The tree's root.
    pub root: ChainHash,
    /// When it was made, milliseconds since the Unix epoch.
    pub sealed_at_ms: i64,
}

impl Checkpoint {
    fn message(&self) -> String {
        format!(
            "correx.checkpoint.v1\n{}\n{}\n{}\n{}\n{}\n{}",
            to_hex(&self.log_id),
            self.position,
            to_hex(&self.hash),
            self.tree_size,
            to_hex(&self.root),
            self.sealed_at_ms
        )
    }

    /// The checkpoint as a JSON object, signed with `key`.
    pub fn to_json(&self, key: &SigningKey) -> serde_json::Value {
        serde_json::json!({
            "correx_checkpoint": 1,
            "log_id": to_hex(&self.log_id),
            "position": self.position,
            "hash": to_hex(&self.hash),
            "tree_size": self.tree_size,
            "root": to_hex(&self.root),
            "sealed_at_ms": self.sealed_at_ms,
            "ed25519": key.sign_hex(self.message().as_bytes()),
        })
    }

    /// The checkpoint in `v`, its signature checked against `key`.
    ///
    /// # Errors
    /// [`EvidenceError::Malformed`] naming what is missing or wrong;
    /// [`EvidenceError::BadSignature`] when `key` did not sign it as it stands.
    pub fn from_json(v: &serde_json::Value, key: &PublicKey) -> Result<Checkpoint, EvidenceError> {
        let bad = |detail: String| EvidenceError::Malformed {
            what: "checkpoint",
            detail,
        };
        let Some(o) = v.as_object() else {
            return Err(bad(format!("a checkpoint is a JSON object, not {v}")));
        };
        if o.get("correx_checkpoint").and_then(|v| v.as_u64()) != Some(1) {
            return Err(bad("no \"correx_checkpoint\": 1".into()));
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
        let c = Checkpoint {
            log_id: hex("log_id")?,
            position: number("position")?,
            hash: hex("hash")?,
            tree_size: number("tree_size")?,
            root: hex("root")?,
            sealed_at_ms: o
                .get("sealed_at_ms")
                .and_then(|v| v.as_i64())
                .ok_or_else(|| bad("\"sealed_at_ms\" is not a whole number".into()))?,
        };
        let Some(sig) = o.get("ed25519").and_then(|v| v.as_str()) else {
            return Err(EvidenceError::BadSignature {
                what: "checkpoint",
                detail: "it is not signed (no \"ed25519\")",
            });
        };
        if !key.verifies(c.message().as_bytes(), sig) {
            return Err(EvidenceError::BadSignature {
                what: "checkpoint",
                detail: "the signature does not match: signed with another key, or changed",
            });
        }
        Ok(c)
    }

    /// Every checkpoint in a file's text (one per line, blank lines skipped), each checked
    /// against `key`.
    ///
    /// # Errors
    /// As [`Checkpoint::from_json`], naming the line.
    pub fn parse_all(text: &str, key: &PublicKey) -> Result<Vec<Checkpoint>, EvidenceError> {
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let at = |e: EvidenceError| EvidenceError::AtLine {
                line: i + 1,
                source: Box::new(e),
            };
            let v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
                at(EvidenceError::Malformed {
                    what: "checkpoint",
                    detail: format!("not JSON: {e}"),
                })
            })?;
            out.push(Self::from_json(&v, key).map_err(at)?);
        }
        Ok(out)
    }

    /// The seal this checkpoint makes of the chain's head, for checking a log against it.
    pub fn seal(&self) -> Seal {
        Seal {
            position: self.position,
            hash: self.hash,
            sealed_at_ms: self.sealed_at_ms,
            signed: true,
        }
    }
}
