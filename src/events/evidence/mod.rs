//! Evidence someone else can check: Ed25519-signed checkpoints of a log, the Merkle tree
//! they commit to, and a session exported as a bundle that verifies offline with only the
//! public key.
//!
//! These read a SQLite log file without writing to it (as `verify` and `seal` do).

mod bundle;
mod checkpoint;
mod keys;
mod leaves;

pub use bundle::{export_session, verify_bundle, BundleReport};
pub use checkpoint::Checkpoint;
pub use keys::{PublicKey, SigningKey};
pub use leaves::{
    check_checkpoints, checkpoint_of_log, prove_consistency, verify_consistency_proof,
};

use std::fmt;
use std::path::PathBuf;

/// What went wrong making or checking evidence.
#[derive(Debug)]
#[non_exhaustive]
pub enum EvidenceError {
    /// A file could not be read or written.
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A key file does not hold a key.
    BadKey {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A checkpoint, bundle or proof is not one.
    Malformed {
        /// What it should have been.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A signature does not match the public key.
    BadSignature {
        /// What was signed.
        what: &'static str,
        /// Unsigned, or signed with another key or changed.
        detail: &'static str,
    },
    /// A line of a checkpoint file is wrong.
    AtLine {
        /// Its number, from 1.
        line: usize,
        /// What is wrong with it.
        source: Box<EvidenceError>,
    },
    /// The log cannot give evidence as it stands (nothing chained, a damaged hash, no such
    /// session): what and what to do.
    Log(String),
    /// Reading the log failed.
    Store(crate::events::EventStoreError),
    /// A bundle or proof does not hold: what was found, at which of its events when one.
    Refused {
        /// The bundle's event (from 0), when the problem is one event's.
        event: Option<usize>,
        /// What does not hold.
        detail: String,
    },
}

impl fmt::Display for EvidenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvidenceError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            EvidenceError::BadKey { path, detail } => write!(f, "{}: {detail}", path.display()),
            EvidenceError::Malformed { what, detail } => write!(f, "not a {what}: {detail}"),
            EvidenceError::BadSignature { what, detail } => write!(f, "{what}: {detail}"),
            EvidenceError::AtLine { line, source } => write!(f, "line {line}: {source}"),
            EvidenceError::Log(detail) => f.write_str(detail),
            EvidenceError::Store(e) => write!(f, "{e}"),
            EvidenceError::Refused {
                event: Some(i),
                detail,
            } => write!(f, "event {i} of the bundle: {detail}"),
            EvidenceError::Refused {
                event: None,
                detail,
            } => f.write_str(detail),
        }
    }
}

impl std::error::Error for EvidenceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EvidenceError::Io { source, .. } => Some(source),
            EvidenceError::AtLine { source, .. } => Some(source.as_ref()),
            EvidenceError::Store(e) => Some(e),
            _ => None,
        }
    }
}

impl From<crate::events::EventStoreError> for EvidenceError {
    fn from(e: crate::events::EventStoreError) -> Self {
        EvidenceError::Store(e)
    }
}
