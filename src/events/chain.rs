//! The hash chain: every event's hash covers the previous event's hash and everything stored of
//! the event itself, so a changed byte, a deleted, inserted or reordered event breaks the chain
//! at its position.
//!
//! `hash = SHA-256(previous hash ‖ canonical encoding of the event)`, where the first chained
//! event's previous hash is 32 zero bytes and the canonical encoding is, in order:
//!
//! | field | encoding |
//! |---|---|
//! | tag | the 16 bytes `correx.event.v1\0` |
//! | position | u64, big-endian |
//! | event_id, stream_id | each: u64 big-endian byte length, then UTF-8 bytes |
//! | stream_version | u64, big-endian |
//! | type_id | length and bytes |
//! | schema_version | u32, big-endian |
//! | timestamp_ms | i64, big-endian |
//! | correlation_id, causation_id | each: byte 0 when absent, else byte 1, length and bytes |
//! | payload | length and bytes, the JSON text exactly as stored |
//!
//! From the position a log's `correx_chain.digest_from` names on (every event of a log made
//! since #52, every event appended after an older log was opened by it), the chain commits to
//! the payload's SHA-256 rather than its bytes, so that a payload can be erased while its
//! digest, and so the chain, stays: the same encoding with the tag `correx.event.v2\0` and, in
//! the payload's place, its 32-byte digest (no length).
//!
//! Anyone can recompute it from the rows with any SHA-256; `correx log verify` does.

use sha2::{Digest, Sha256};

/// A SHA-256 hash of the chain.
pub type ChainHash = [u8; 32];

/// The previous hash of the first chained event.
pub const GENESIS: ChainHash = [0; 32];

const TAG: &[u8; 16] = b"correx.event.v1\0";
const TAG_DIGESTED: &[u8; 16] = b"correx.event.v2\0";

/// A payload's SHA-256: what a digested link commits to.
pub fn payload_digest(payload: &str) -> ChainHash {
    Sha256::digest(payload.as_bytes()).into()
}

/// What of a stored event the chain covers: every column but the hash.
#[derive(Clone, Copy, Debug)]
pub struct Link<'a> {
    /// Global position.
    pub position: u64,
    /// The event's id.
    pub event_id: &'a str,
    /// Its stream.
    pub stream_id: &'a str,
    /// Its version in the stream.
    pub stream_version: u64,
    /// Its type.
    pub type_id: &'a str,
    /// Its payload's schema version.
    pub schema_version: u32,
    /// When it was appended.
    pub timestamp_ms: i64,
    /// Its correlation id.
    pub correlation_id: Option<&'a str>,
    /// Its causation id.
    pub causation_id: Option<&'a str>,
    /// The payload's JSON text as stored.
    pub payload: &'a str,
}

impl Link<'_> {
    /// This event's hash, following `previous`.
    pub fn hash(&self, previous: &ChainHash) -> ChainHash {
        let mut h = self.fields(previous, TAG);
        text(&mut h, self.payload);
        h.finalize().into()
    }

    /// This event's hash in the digested form, following `previous`, where `digest` is its
    /// payload's SHA-256 (as [`payload_digest`] makes it, or as kept for an erased payload).
    pub fn hash_digested(&self, previous: &ChainHash, digest: &ChainHash) -> ChainHash {
        let mut h = self.fields(previous, TAG_DIGESTED);
        h.update(digest);
        h.finalize().into()
    }

    /// This event's hash in the form its position takes in a log digested from `digest_from`:
    /// digested there and after (with `erased`, the kept digest of an erased payload, in place
    /// of the payload's), whole before.
    pub fn hash_at(
        &self,
        previous: &ChainHash,
        digest_from: u64,
        erased: Option<&ChainHash>,
    ) -> ChainHash {
        if self.position < digest_from {
            return self.hash(previous);
        }
        match erased {
            Some(d) => self.hash_digested(previous, d),
            None => self.hash_digested(previous, &payload_digest(self.payload)),
        }
    }

    fn fields(&self, previous: &ChainHash, tag: &[u8; 16]) -> Sha256 {
        let mut h = Sha256::new();
        h.update(previous);
        h.update(tag);
        h.update(self.position.to_be_bytes());
        text(&mut h, self.event_id);
        text(&mut h, self.stream_id);
        h.update(self.stream_version.to_be_bytes());
        text(&mut h, self.type_id);
        h.update(self.schema_version.to_be_bytes());
        h.update(self.timestamp_ms.to_be_bytes());
        optional(&mut h, self.correlation_id);
        optional(&mut h, self.causation_id);
        h
    }
}

fn text(h: &mut Sha256, s: &str) {
    h.update((s.len() as u64).to_be_bytes());
    h.update(s.as_bytes());
}

fn optional(h: &mut Sha256, s: Option<&str>) {
    match s {
        None => h.update([0u8]),
        Some(s) => {
            h.update([1u8]);
            text(h, s);
        }
    }
}

/// `hash` as lowercase hex.
pub fn to_hex(hash: &ChainHash) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// A 64-digit hex string as a hash; `None` when it is not one.
pub fn from_hex(text: &str) -> Option<ChainHash> {
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(payload: &str) -> Link<'_> {
        Link {
            position: 7,
            event_id: "e",
            stream_id: "s",
            stream_version: 1,
            type_id: "t",
            schema_version: 1,
            timestamp_ms: 5,
            correlation_id: None,
            causation_id: Some(""),
            payload,
        }
    }

    #[test]
    fn every_field_and_the_previous_hash_change_the_hash() {
        let base = link("{}").hash(&GENESIS);
        assert_ne!(base, link("{ }").hash(&GENESIS));
        assert_ne!(base, link("{}").hash(&[1; 32]));
        let mut l = link("{}");
        l.position = 8;
        assert_ne!(base, l.hash(&GENESIS));
        // Absent and empty are different values.
        let mut l = link("{}");
        l.causation_id = None;
        assert_ne!(base, l.hash(&GENESIS));
        // Lengths keep fields apart: "ab"+"c" is not "a"+"bc".
        let (mut a, mut b) = (link("{}"), link("{}"));
        (a.event_id, a.stream_id) = ("ab", "c");
        (b.event_id, b.stream_id) = ("a", "bc");
        assert_ne!(a.hash(&GENESIS), b.hash(&GENESIS));
    }

    #[test]
    fn the_digested_form_commits_to_the_payload_through_its_digest_alone() {
        let l = link("{\"a\":1}");
        let d = payload_digest(l.payload);
        assert_eq!(l.hash_at(&GENESIS, 7, None), l.hash_digested(&GENESIS, &d));
        assert_eq!(l.hash_at(&GENESIS, 8, None), l.hash(&GENESIS));
        assert_ne!(l.hash(&GENESIS), l.hash_digested(&GENESIS, &d));
        // An erased payload's kept digest stands in for it; another digest does not.
        let erased = link("{\"correx_erased\":true}");
        assert_eq!(
            erased.hash_at(&GENESIS, 1, Some(&d)),
            l.hash_at(&GENESIS, 1, None)
        );
        assert_ne!(
            erased.hash_at(&GENESIS, 1, Some(&[0; 32])),
            l.hash_at(&GENESIS, 1, None)
        );
        assert_ne!(
            link("{ }").hash_at(&GENESIS, 1, None),
            l.hash_at(&GENESIS, 1, None)
        );
    }

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_a_hash() {
        let h = link("{}").hash(&GENESIS);
        assert_eq!(from_hex(&to_hex(&h)), Some(h));
        assert_eq!(from_hex("00"), None);
        assert_eq!(from_hex(&"g".repeat(64)), None);
        assert_eq!(from_hex(&"é".repeat(32)), None);
        assert_eq!(from_hex(&"+f".repeat(32)), None);
    }
}
