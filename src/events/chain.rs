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
//! Anyone can recompute it from the rows with any SHA-256; `correx log verify` does.

use sha2::{Digest, Sha256};

/// A SHA-256 hash of the chain.
pub type ChainHash = [u8; 32];

/// The previous hash of the first chained event.
pub const GENESIS: ChainHash = [0; 32];

const TAG: &[u8; 16] = b"correx.event.v1\0";

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
        let mut h = Sha256::new();
        h.update(previous);
        h.update(TAG);
        h.update(self.position.to_be_bytes());
        text(&mut h, self.event_id);
        text(&mut h, self.stream_id);
        h.update(self.stream_version.to_be_bytes());
        text(&mut h, self.type_id);
        h.update(self.schema_version.to_be_bytes());
        h.update(self.timestamp_ms.to_be_bytes());
        optional(&mut h, self.correlation_id);
        optional(&mut h, self.causation_id);
        text(&mut h, self.payload);
        h.finalize().into()
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
    fn hex_round_trips_and_refuses_what_is_not_a_hash() {
        let h = link("{}").hash(&GENESIS);
        assert_eq!(from_hex(&to_hex(&h)), Some(h));
        assert_eq!(from_hex("00"), None);
        assert_eq!(from_hex(&"g".repeat(64)), None);
        assert_eq!(from_hex(&"é".repeat(32)), None);
        assert_eq!(from_hex(&"+f".repeat(32)), None);
    }
}
