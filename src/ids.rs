//! Identity newtypes shared by every component.
//!
//! Each id is a string so that hosts may bring their own (a UUID, a slug, a path-safe name); the
//! [`EventId::random`] and friends generate time-ordered UUIDv7 ids when the host has none.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps an existing id.
            pub fn from_string(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            /// A fresh random id (UUIDv7 format: time-ordered, then random).
            pub fn random() -> Self {
                Self(random_uuid())
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }
    };
}

string_id!(
    /// One agent session; also the event stream its tool events go to (`session-{id}`).
    SessionId
);
string_id!(
    /// One stage of a session (a planning step, a sub-task).
    StageId
);
string_id!(
    /// One tool invocation; its started/completed/failed/rejected events carry it.
    ToolInvocationId
);
string_id!(
    /// One inference provider, e.g. `llama-cpp:gemma-3-270m`.
    ProviderId
);
string_id!(
    /// One event; unique in a store, so appending the same id twice stores it once.
    EventId
);

/// A UUIDv7 string.
pub(crate) fn random_uuid() -> String {
    // UUIDv7: 48 bits of Unix milliseconds, then random bits. Ids made close in time sort
    // close together, so the event log's unique index on ids grows at its right edge instead
    // of dirtying a random page per append.
    let mut b = random_bytes::<16>();
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    b[..6].copy_from_slice(&ms.to_be_bytes()[2..8]);
    b[6] = (b[6] & 0x0f) | 0x70;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut hex = String::with_capacity(32);
    for x in b {
        use std::fmt::Write;
        let _ = write!(hex, "{x:02x}");
    }
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Random bytes for ids and jitter: a per-thread splitmix64 generator seeded once from the
/// kernel (ids need uniqueness, not secrecy; a syscall per id was a visible share of an
/// append).
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new(seed());
    }
    let mut buf = [0u8; N];
    STATE.with(|state| {
        for chunk in buf.chunks_mut(8) {
            let x = state.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
            state.set(x);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
        }
    });
    buf
}

/// A seed from the kernel, or from the time, pid and a counter when `getrandom` fails.
fn seed() -> u64 {
    let mut buf = [0u8; 8];
    if crate::sys::getrandom(&mut buf) {
        return u64::from_le_bytes(buf);
    }
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_are_uuid_shaped_and_distinct() {
        let a = EventId::random();
        let b = EventId::random();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 36);
        assert_eq!(a.as_str().as_bytes()[14], b'7');
        // Time-ordered: an id made later never sorts before one made a millisecond earlier.
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(EventId::random() > a);
    }
}
