//! Messages that quote input stay short: a 100 MB path in a request must not come back whole
//! in an error, a tool result or an event.

/// The longest message correx hands out, in bytes.
pub(crate) const MAX_MESSAGE: usize = 4096;

/// The start of `text`, at most `max` bytes, cut at a character boundary.
pub(crate) fn prefix(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `message` cut to at most [`MAX_MESSAGE`] bytes (at a character boundary), saying how much
/// was cut.
pub(crate) fn bounded(message: impl Into<String>) -> String {
    let mut message: String = message.into();
    if message.len() <= MAX_MESSAGE {
        return message;
    }
    let cut = message.len();
    let end = prefix(&message, MAX_MESSAGE - 64).len();
    message.truncate(end);
    message.push_str(&format!("… ({} more bytes cut)", cut - end));
    message
}

/// Standard base64 with padding (RFC 4648), for bytes that are not text.
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ABC[(n >> shift & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `bytes` as lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// A file-name component safe to use whatever the id holds.
pub(crate) fn safe_component(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    if out.is_empty() {
        out.push_str("%00");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648() {
        for (raw, enc) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"fooba", "Zm9vYmE="),
            (b"foobar", "Zm9vYmFy"),
            (&[0xff, 0xfe, 0x00], "//4A"),
        ] {
            assert_eq!(base64(raw), enc);
        }
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        assert_eq!(bounded("short"), "short");
        let long = format!("path {} escapes", "é".repeat(1_000_000));
        let b = bounded(long.clone());
        assert!(b.len() <= MAX_MESSAGE, "{}", b.len());
        assert!(b.starts_with("path éé"));
        assert!(b.ends_with("more bytes cut)"));
    }
}
