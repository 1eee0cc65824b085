//! The tree's leaves as a log file holds them, and what is made of them: checkpoints, checks of
//! a log against checkpoints, consistency proofs.

use super::checkpoint::Checkpoint;
use super::keys::PublicKey;
use super::EvidenceError;
use crate::events::chain::{from_hex, to_hex, ChainHash};
use crate::events::merkle::{leaf_hash, verify_consistency, Tree};
use crate::events::verify::{chain_start, open_log_read_only, LogProblem};
use rusqlite::Connection;
use std::path::Path;

/// The chained events of a log, in position order: positions and chain hashes.
pub(super) struct Leaves {
    pub(super) positions: Vec<u64>,
    pub(super) hashes: Vec<ChainHash>,
    pub(super) chain_from: u64,
}

impl Leaves {
    /// Reads them; an event after the chain's start without a well-formed hash is an error
    /// (the log is damaged: `verify` names how).
    pub(super) fn read(conn: &Connection) -> Result<Leaves, EvidenceError> {
        let Some(chain_from) = chain_start(conn) else {
            return Err(EvidenceError::Log(
                "the log has no hash chain yet (an older correx wrote it): open it with this \
                 correx and append once"
                    .into(),
            ));
        };
        let sqlite = |e: rusqlite::Error| EvidenceError::Log(format!("reading the log: {e}"));
        let mut st = conn
            .prepare("SELECT position, hash FROM events WHERE position >= ?1 ORDER BY position")
            .map_err(sqlite)?;
        let mut rows = st.query([chain_from as i64]).map_err(sqlite)?;
        let (mut positions, mut hashes) = (Vec::new(), Vec::new());
        while let Some(r) = rows.next().map_err(sqlite)? {
            let position = r.get::<_, i64>(0).map_err(sqlite)?.max(0) as u64;
            let hash = match r.get_ref(1).map_err(sqlite)? {
                rusqlite::types::ValueRef::Blob(b) => ChainHash::try_from(b).ok(),
                _ => None,
            };
            let Some(hash) = hash else {
                return Err(EvidenceError::Log(format!(
                    "the event at position {position} has no well-formed hash: the log is \
                     damaged (`correx log verify` says how)"
                )));
            };
            positions.push(position);
            hashes.push(hash);
        }
        if hashes.is_empty() {
            return Err(EvidenceError::Log(
                "no event is chained yet: there is nothing to sign".into(),
            ));
        }
        Ok(Leaves {
            positions,
            hashes,
            chain_from,
        })
    }

    pub(super) fn tree(&self) -> Tree {
        Tree::new(self.hashes.iter().map(leaf_hash).collect())
    }

    /// The checkpoint of the whole log, made now.
    pub(super) fn checkpoint(&self, tree: &Tree) -> Checkpoint {
        let last = self.hashes.len() - 1;
        Checkpoint {
            log_id: self.hashes[0],
            position: self.positions[last],
            hash: self.hashes[last],
            tree_size: tree.size(),
            root: tree.root(),
            sealed_at_ms: crate::events::time::now_ms(),
        }
    }
}

/// A checkpoint of the log file at `path` as it stands, read without writing to it.
///
/// # Errors
/// [`EvidenceError::Store`] when it is not a log; [`EvidenceError::Log`] when nothing is
/// chained or a hash is damaged.
pub fn checkpoint_of_log(path: &Path) -> Result<Checkpoint, EvidenceError> {
    let conn = open_log_read_only(path)?;
    let leaves = Leaves::read(&conn)?;
    Ok(leaves.checkpoint(&leaves.tree()))
}

/// What `checkpoints` say of the log file at `path` beyond its head (which `verify` checks as
/// a seal): each must name this log, and its root must be the tree's over the events up to its
/// position.
///
/// # Errors
/// As [`checkpoint_of_log`].
pub fn check_checkpoints(
    path: &Path,
    checkpoints: &[Checkpoint],
) -> Result<Vec<LogProblem>, EvidenceError> {
    let conn = open_log_read_only(path)?;
    let leaves = Leaves::read(&conn)?;
    let tree = leaves.tree();
    let mut problems = Vec::new();
    for c in checkpoints {
        let problem = |detail: String| LogProblem {
            position: Some(c.position),
            detail,
        };
        if c.log_id != leaves.hashes[0] {
            problems.push(problem(format!(
                "the checkpoint is of another log (log id {}, this log's is {})",
                to_hex(&c.log_id),
                to_hex(&leaves.hashes[0])
            )));
            continue;
        }
        let size_here = leaves.positions.partition_point(|p| *p <= c.position) as u64;
        if size_here != c.tree_size {
            problems.push(problem(format!(
                "the checkpoint counts {} chained events up to position {}, the log holds {}",
                c.tree_size, c.position, size_here
            )));
        } else if tree.root_at(c.tree_size) != Some(c.root) {
            problems.push(problem(format!(
                "the Merkle root over the first {} events is not the checkpoint's ({}): an \
                 event up to position {} was changed, removed or added",
                c.tree_size,
                to_hex(&c.root),
                c.position
            )));
        }
    }
    Ok(problems)
}

/// A consistency proof, as a JSON object holding both checkpoints (as given, signed) and the
/// proof that the log at `new` extends the log at `old`, made from the log file at `path`.
///
/// # Errors
/// [`EvidenceError::Refused`] when the checkpoints are of another log, out of order, or past
/// this log; as [`checkpoint_of_log`].
pub fn prove_consistency(
    path: &Path,
    old: (&Checkpoint, &serde_json::Value),
    new: (&Checkpoint, &serde_json::Value),
) -> Result<serde_json::Value, EvidenceError> {
    let conn = open_log_read_only(path)?;
    let leaves = Leaves::read(&conn)?;
    let refuse = |detail: String| EvidenceError::Refused {
        event: None,
        detail,
    };
    for c in [old.0, new.0] {
        if c.log_id != leaves.hashes[0] {
            return Err(refuse(format!(
                "the checkpoint at position {} is of another log",
                c.position
            )));
        }
    }
    let tree = leaves.tree();
    let proof = tree
        .consistency(old.0.tree_size, new.0.tree_size)
        .ok_or_else(|| {
            refuse(format!(
                "no proof from tree size {} to {} in a log of {} chained events: the first must \
                 be at least 1, not past the second, and the second not past the log",
                old.0.tree_size,
                new.0.tree_size,
                tree.size()
            ))
        })?;
    let (old_c, new_c) = (old.0, new.0);
    let here = |c: &Checkpoint| tree.root_at(c.tree_size) == Some(c.root);
    if !here(old_c) || !here(new_c) {
        return Err(refuse(format!(
            "this log does not extend the checkpoint{} at tree size {}: its events up to there \
             were rewritten since it was made",
            if here(old_c) { "" } else { " (the older)" },
            if here(old_c) {
                new_c.tree_size
            } else {
                old_c.tree_size
            },
        )));
    }
    Ok(serde_json::json!({
        "correx_consistency": 1,
        "old": old.1,
        "new": new.1,
        "proof": proof.iter().map(to_hex).collect::<Vec<_>>(),
    }))
}

/// Checks a consistency proof (as [`prove_consistency`] writes it) with only the public key:
/// both checkpoints signed by `key`, of one log, the newer extending the older. Returns them,
/// older first.
///
/// # Errors
/// [`EvidenceError::Malformed`], [`EvidenceError::BadSignature`], or
/// [`EvidenceError::Refused`] when the log did not only grow between them.
pub fn verify_consistency_proof(
    v: &serde_json::Value,
    key: &PublicKey,
) -> Result<(Checkpoint, Checkpoint), EvidenceError> {
    let bad = |detail: String| EvidenceError::Malformed {
        what: "consistency proof",
        detail,
    };
    let Some(o) = v.as_object() else {
        return Err(bad("a proof is a JSON object".into()));
    };
    if o.get("correx_consistency").and_then(|v| v.as_u64()) != Some(1) {
        return Err(bad("no \"correx_consistency\": 1".into()));
    }
    let old = Checkpoint::from_json(o.get("old").unwrap_or(&serde_json::Value::Null), key)?;
    let new = Checkpoint::from_json(o.get("new").unwrap_or(&serde_json::Value::Null), key)?;
    let proof =
        hashes(o.get("proof")).ok_or_else(|| bad("\"proof\" is not a list of hashes".into()))?;
    let refuse = |detail: String| EvidenceError::Refused {
        event: None,
        detail,
    };
    if old.log_id != new.log_id {
        return Err(refuse("the two checkpoints are of different logs".into()));
    }
    if !verify_consistency(old.tree_size, new.tree_size, &old.root, &new.root, &proof) {
        return Err(refuse(format!(
            "the log at tree size {} (position {}) does not extend the log at tree size {} \
             (position {}): it was rewritten, not only appended to",
            new.tree_size, new.position, old.tree_size, old.position
        )));
    }
    Ok((old, new))
}

/// A JSON list of 64-hex-digit hashes.
pub(super) fn hashes(v: Option<&serde_json::Value>) -> Option<Vec<ChainHash>> {
    v?.as_array()?
        .iter()
        .map(|h| h.as_str().and_then(from_hex))
        .collect()
}
