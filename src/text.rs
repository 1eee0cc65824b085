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

#[cfg(test)]
mod tests {
    use super::*;

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
