//! A session exported as a bundle: its events, each with its inclusion proof against a signed
//! checkpoint of the log, and a signed statement listing them — checkable offline with only
//! the public key.
//!
//! ```text
//! {"correx_bundle": 1, "session": "<id>", "checkpoint": {...},
//!  "events": [{"leaf_index": I, "previous": "<64 hex>", "position": N, "event_id": ..,
//!              "stream_id": .., "stream_version": .., "type_id": .., "schema_version": ..,
//!              "timestamp_ms": .., "correlation_id": .. | null, "causation_id": .. | null,
//!              "payload": "<the JSON text as stored>", "proof": ["<64 hex>", ...],
//!              "digested": true}, ...],
//!  "ed25519": "<128 hex>"}
//! ```
//!
//! `digested` marks an event whose chain hash commits to its payload's digest (see
//! [`chain`](crate::events::chain)); an erased event has `"payload": null` and its kept
//! `"payload_digest"` instead. Each event's chain hash is recomputed from its fields and
//! `previous`; its leaf must be in
//! the checkpoint's tree at `leaf_index` (so a changed event is found), and the statement
//! `correx.bundle.v1\n{log_id}\n{session}\n{tree_size}\n{root}\n` followed by one line
//! `{leaf_index} {chain hash}\n` per event must carry the key's signature (so an event removed
//! from or added to the bundle is found). A session's events are those of its stream
//! (`session-<id>`) and those whose payload names it (`"session_id"`).

use super::checkpoint::Checkpoint;
use super::keys::{PublicKey, SigningKey};
use super::leaves::{hashes, Leaves};
use super::EvidenceError;
use crate::events::chain::{from_hex, payload_digest, to_hex, ChainHash, Link, GENESIS};
use crate::events::merkle::{leaf_hash, verify_inclusion};
use crate::events::verify::{digest_start, erased_digests, open_log_read_only};
use rusqlite::Connection;
use std::path::Path;

/// What a bundle that verified holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleReport {
    /// The session.
    pub session: String,
    /// How many events.
    pub events: usize,
    /// The checkpoint they were proved against.
    pub checkpoint: Checkpoint,
    /// The positions of the events whose payloads were erased (their digests proved).
    pub erased: Vec<u64>,
}

fn belongs(session: &str, stream: &str, payload: &serde_json::Value) -> bool {
    stream == crate::domain::session_stream(session)
        || payload.get("session_id").and_then(|v| v.as_str()) == Some(session)
}

/// The hash the first chained event follows: the chain over the events before it, in
/// passing (the genesis when there are none).
fn prefix_hash(conn: &Connection, chain_from: u64) -> Result<ChainHash, EvidenceError> {
    let sqlite = |e: rusqlite::Error| EvidenceError::Log(format!("reading the log: {e}"));
    let mut st = conn
        .prepare(
            "SELECT position, event_id, stream_id, stream_version, type_id, schema_version, \
             timestamp_ms, correlation_id, causation_id, payload FROM events \
             WHERE position < ?1 ORDER BY position",
        )
        .map_err(sqlite)?;
    let mut rows = st.query([chain_from as i64]).map_err(sqlite)?;
    let mut h = GENESIS;
    while let Some(r) = rows.next().map_err(sqlite)? {
        h = crate::events::sqlite::link_of(r).map_err(sqlite)?.hash_at(
            &h,
            digest_start(conn),
            None,
        );
    }
    Ok(h)
}

/// The bundle of `session`'s events in the log file at `path` (read without writing to it),
/// proved against a checkpoint of the whole log made now and signed with `key`.
///
/// # Errors
/// [`EvidenceError::Log`] when the session has no chained events or the log cannot give
/// evidence; [`EvidenceError::Store`] when the file is not a log.
pub fn export_session(
    path: &Path,
    session: &str,
    key: &SigningKey,
) -> Result<serde_json::Value, EvidenceError> {
    let conn = open_log_read_only(path)?;
    let leaves = Leaves::read(&conn)?;
    let tree = leaves.tree();
    let checkpoint = leaves.checkpoint(&tree);
    let sqlite = |e: rusqlite::Error| EvidenceError::Log(format!("reading the log: {e}"));
    // The text search narrows the rows whose JSON is parsed to those that can name it.
    let mut st = conn
        .prepare(
            "SELECT position, event_id, stream_id, stream_version, type_id, schema_version, \
             timestamp_ms, correlation_id, causation_id, payload FROM events \
             WHERE stream_id = ?1 OR instr(payload, ?2) > 0 ORDER BY position",
        )
        .map_err(sqlite)?;
    let stream = crate::domain::session_stream(session);
    let quoted = serde_json::Value::from(session).to_string();
    let mut rows = st
        .query(rusqlite::params![stream, quoted])
        .map_err(sqlite)?;
    let mut events = Vec::new();
    let mut statement = statement_head(&checkpoint, session);
    let (digest_from, erased) = (digest_start(&conn), erased_digests(&conn));
    while let Some(r) = rows.next().map_err(sqlite)? {
        let link = crate::events::sqlite::link_of(r).map_err(sqlite)?;
        let kept = erased.get(&link.position);
        if kept.is_none() {
            let payload: serde_json::Value = serde_json::from_str(link.payload)
                .map_err(|e| EvidenceError::Log(format!("position {}: {e}", link.position)))?;
            if !belongs(session, link.stream_id, &payload) {
                continue;
            }
        } else if link.stream_id != stream {
            // An erased payload no longer says whose it was: only its stream does.
            continue;
        }
        let Ok(index) = leaves.positions.binary_search(&link.position) else {
            return Err(EvidenceError::Log(format!(
                "the session's event at position {} predates the hash chain (it starts at {}): \
                 it cannot be proved",
                link.position, leaves.chain_from
            )));
        };
        let previous = match index {
            0 => prefix_hash(&conn, leaves.chain_from)?,
            i => leaves.hashes[i - 1],
        };
        let hash = leaves.hashes[index];
        statement.push_str(&format!("{index} {}\n", to_hex(&hash)));
        let proof = tree
            .inclusion(index as u64, tree.size())
            .unwrap_or_default();
        let mut event = serde_json::json!({
            "leaf_index": index,
            "previous": to_hex(&previous),
            "position": link.position,
            "event_id": link.event_id,
            "stream_id": link.stream_id,
            "stream_version": link.stream_version,
            "type_id": link.type_id,
            "schema_version": link.schema_version,
            "timestamp_ms": link.timestamp_ms,
            "correlation_id": link.correlation_id,
            "causation_id": link.causation_id,
            "payload": link.payload,
            "proof": proof.iter().map(to_hex).collect::<Vec<_>>(),
        });
        if link.position >= digest_from {
            event["digested"] = true.into();
        }
        if let Some(d) = kept {
            event["payload"] = serde_json::Value::Null;
            event["payload_digest"] = to_hex(d).into();
        }
        events.push(event);
    }
    if events.is_empty() {
        return Err(EvidenceError::Log(format!(
            "the log holds no events of session {session:?}"
        )));
    }
    Ok(serde_json::json!({
        "correx_bundle": 1,
        "session": session,
        "checkpoint": checkpoint.to_json(key),
        "events": events,
        "ed25519": key.sign_hex(statement.as_bytes()),
    }))
}

fn statement_head(c: &Checkpoint, session: &str) -> String {
    format!(
        "correx.bundle.v1\n{}\n{}\n{}\n{}\n",
        to_hex(&c.log_id),
        session,
        c.tree_size,
        to_hex(&c.root)
    )
}

/// Checks a bundle with nothing but `key`: the checkpoint's signature, every event's hash and
/// inclusion proof, that every event is the session's and its stream has no gap, and the
/// signed list of events (nothing removed, added or moved). With `expected`, the bundle must
/// be proved against that checkpoint (the same log, the same tree): a bundle from another log
/// or an older checkpoint is refused.
///
/// # Errors
/// [`EvidenceError::Malformed`], [`EvidenceError::BadSignature`], or
/// [`EvidenceError::Refused`] naming the first thing that does not hold.
pub fn verify_bundle(
    v: &serde_json::Value,
    key: &PublicKey,
    expected: Option<&Checkpoint>,
) -> Result<BundleReport, EvidenceError> {
    let bad = |detail: String| EvidenceError::Malformed {
        what: "bundle",
        detail,
    };
    let Some(o) = v.as_object() else {
        return Err(bad("a bundle is a JSON object".into()));
    };
    if o.get("correx_bundle").and_then(|v| v.as_u64()) != Some(1) {
        return Err(bad("no \"correx_bundle\": 1".into()));
    }
    let session = o
        .get("session")
        .and_then(|v| v.as_str())
        .ok_or_else(|| bad("\"session\" is not a string".into()))?;
    let checkpoint =
        Checkpoint::from_json(o.get("checkpoint").unwrap_or(&serde_json::Value::Null), key)?;
    let refuse = |event: Option<usize>, detail: String| EvidenceError::Refused { event, detail };
    if let Some(want) = expected {
        if want.log_id != checkpoint.log_id {
            return Err(refuse(
                None,
                format!(
                    "the bundle is of another log (log id {}, not {})",
                    to_hex(&checkpoint.log_id),
                    to_hex(&want.log_id)
                ),
            ));
        }
        if (want.tree_size, want.root) != (checkpoint.tree_size, checkpoint.root) {
            return Err(refuse(
                None,
                format!(
                    "the bundle is proved against the checkpoint at tree size {} (position {}), \
                     not the one given at tree size {} (position {})",
                    checkpoint.tree_size, checkpoint.position, want.tree_size, want.position
                ),
            ));
        }
    }
    let events = o
        .get("events")
        .and_then(|v| v.as_array())
        .ok_or_else(|| bad("\"events\" is not a list".into()))?;
    let mut statement = statement_head(&checkpoint, session);
    let mut erased = Vec::new();
    let mut last_index = None;
    let mut version = 0u64;
    let stream = crate::domain::session_stream(session);
    for (i, e) in events.iter().enumerate() {
        let event = BundleEvent::parse(e).map_err(|d| refuse(Some(i), d))?;
        if last_index.is_some_and(|l| event.leaf_index <= l) {
            return Err(refuse(
                Some(i),
                "the events are not in log order: one was moved or repeated".into(),
            ));
        }
        last_index = Some(event.leaf_index);
        let hash = event.hash().map_err(|d| refuse(Some(i), d))?;
        if !verify_inclusion(
            event.leaf_index,
            checkpoint.tree_size,
            &leaf_hash(&hash),
            &event.proof,
            &checkpoint.root,
        ) {
            return Err(refuse(
                Some(i),
                format!(
                    "position {}: not in the signed log as it stands here: the event was \
                     changed, or its proof does not belong to this checkpoint",
                    event.position
                ),
            ));
        }
        let member = match &event.payload {
            // An erased payload: only its stream can say whose it was.
            None => event.stream_id == stream,
            Some(text) => {
                let payload: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| refuse(Some(i), format!("the payload is not JSON: {e}")))?;
                belongs(session, &event.stream_id, &payload)
            }
        };
        if !member {
            return Err(refuse(
                Some(i),
                format!(
                    "position {}: not an event of session {session:?}",
                    event.position
                ),
            ));
        }
        if event.stream_id == stream {
            version += 1;
            if event.stream_version != version {
                return Err(refuse(
                    Some(i),
                    format!(
                        "the session's stream jumps to version {} where {version} comes next: \
                         an event was removed",
                        event.stream_version
                    ),
                ));
            }
        }
        if event.payload.is_none() {
            erased.push(event.position);
        }
        statement.push_str(&format!("{} {}\n", event.leaf_index, to_hex(&hash)));
    }
    let sig = o.get("ed25519").and_then(|v| v.as_str()).unwrap_or("");
    if !key.verifies(statement.as_bytes(), sig) {
        return Err(refuse(
            None,
            "the signed list of the session's events is not these events: one was removed, \
             added or replaced (or the bundle was not signed with this key)"
                .into(),
        ));
    }
    Ok(BundleReport {
        session: session.to_owned(),
        events: events.len(),
        checkpoint,
        erased,
    })
}

/// One event of a bundle, as read.
struct BundleEvent {
    leaf_index: u64,
    previous: ChainHash,
    position: u64,
    event_id: String,
    stream_id: String,
    stream_version: u64,
    type_id: String,
    schema_version: u32,
    timestamp_ms: i64,
    correlation_id: Option<String>,
    causation_id: Option<String>,
    /// `None` for an erased payload, whose digest is `payload_digest`.
    payload: Option<String>,
    payload_digest: Option<ChainHash>,
    digested: bool,
    proof: Vec<ChainHash>,
}

impl BundleEvent {
    fn parse(v: &serde_json::Value) -> Result<BundleEvent, String> {
        let o = v.as_object().ok_or("an event is a JSON object")?;
        let number = |k: &str| {
            o.get(k)
                .and_then(|v| v.as_u64())
                .ok_or(format!("{k:?} is not a whole number"))
        };
        let text = |k: &str| {
            o.get(k)
                .and_then(|v| v.as_str())
                .map(str::to_owned)
                .ok_or(format!("{k:?} is not a string"))
        };
        let optional = |k: &str| match o.get(k) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("{k:?} is neither a string nor null")),
        };
        Ok(BundleEvent {
            leaf_index: number("leaf_index")?,
            previous: o
                .get("previous")
                .and_then(|v| v.as_str())
                .and_then(from_hex)
                .ok_or("\"previous\" is not 64 hex digits")?,
            position: number("position")?,
            event_id: text("event_id")?,
            stream_id: text("stream_id")?,
            stream_version: number("stream_version")?,
            type_id: text("type_id")?,
            schema_version: u32::try_from(number("schema_version")?)
                .map_err(|_| "\"schema_version\" is too large")?,
            timestamp_ms: o
                .get("timestamp_ms")
                .and_then(|v| v.as_i64())
                .ok_or("\"timestamp_ms\" is not a whole number")?,
            correlation_id: optional("correlation_id")?,
            causation_id: optional("causation_id")?,
            payload: optional("payload")?,
            payload_digest: match o.get("payload_digest") {
                None | Some(serde_json::Value::Null) => None,
                Some(v) => Some(
                    v.as_str()
                        .and_then(from_hex)
                        .ok_or("\"payload_digest\" is not 64 hex digits")?,
                ),
            },
            digested: match o.get("digested") {
                None => false,
                Some(v) => v.as_bool().ok_or("\"digested\" is not true or false")?,
            },
            proof: hashes(o.get("proof")).ok_or("\"proof\" is not a list of hashes")?,
        })
    }

    /// Its chain hash, in its form: whole, digested, or (erased) from the kept digest.
    fn hash(&self) -> Result<ChainHash, String> {
        let link = self.link();
        match (&self.payload, self.payload_digest, self.digested) {
            (Some(_), None, false) => Ok(link.hash(&self.previous)),
            (Some(p), None, true) => Ok(link.hash_digested(&self.previous, &payload_digest(p))),
            (None, Some(d), true) => Ok(link.hash_digested(&self.previous, &d)),
            (None, None, _) => Err("\"payload\" is not a string".into()),
            (None, Some(_), false) => Err("an erased payload is always digested".into()),
            (Some(_), Some(_), _) => {
                Err("an event has a payload or an erased payload's digest, not both".into())
            }
        }
    }

    fn link(&self) -> Link<'_> {
        Link {
            position: self.position,
            event_id: &self.event_id,
            stream_id: &self.stream_id,
            stream_version: self.stream_version,
            type_id: &self.type_id,
            schema_version: self.schema_version,
            timestamp_ms: self.timestamp_ms,
            correlation_id: self.correlation_id.as_deref(),
            causation_id: self.causation_id.as_deref(),
            payload: self.payload.as_deref().unwrap_or(""),
        }
    }
}
