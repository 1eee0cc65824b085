//! JSON Schema's `pattern`: an ECMA-262 regular expression, checked with a linear-time engine
//! (the `regex` crate, which never backtracks), so a hostile pattern from a server cannot hang
//! correx. ECMA's meanings are kept where they differ from the engine's: `\d`, `\w`, `\s` and
//! `\b` are ASCII classes (and `\s` ECMA's whitespace), `.` matches anything but a line
//! terminator, and a `[` inside a class is a literal. A pattern the engine cannot take (a
//! lookaround, a backreference, a Unicode property, one larger than [`SIZE_LIMIT`]) is not
//! checked here; the server checks it again.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// The most memory one compiled pattern may take.
const SIZE_LIMIT: usize = 1 << 20;

/// Patterns kept compiled (a tool's schema is checked on every call); past this many the
/// cache starts over.
const CACHED: usize = 256;

/// ECMA-262's `\s`: its WhiteSpace and LineTerminator code points.
const SPACE: &str = r"\t\n\x0B\x0C\r \x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF}";

/// Whether `text` matches `pattern` (anywhere in it, as ECMA's `test` does); `None` when the
/// pattern cannot be checked here.
pub(crate) fn matches(pattern: &str, text: &str) -> Option<bool> {
    compiled(pattern).map(|r| r.is_match(text))
}

fn compiled(pattern: &str) -> Option<Arc<regex::Regex>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<Arc<regex::Regex>>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(hit) = cache.lock().get(pattern) {
        return hit.clone();
    }
    let built = translate(pattern).and_then(|p| {
        regex::RegexBuilder::new(&p)
            .size_limit(SIZE_LIMIT)
            .dfa_size_limit(SIZE_LIMIT)
            .nest_limit(64)
            .build()
            .ok()
            .map(Arc::new)
    });
    let mut cache = cache.lock();
    if cache.len() >= CACHED {
        cache.clear();
    }
    cache.insert(pattern.to_owned(), built.clone());
    built
}

/// `pattern` in the engine's syntax with ECMA's meanings; `None` when it uses what the
/// engine lacks.
fn translate(pattern: &str) -> Option<String> {
    let mut out = String::with_capacity(pattern.len() * 2);
    let mut chars = pattern.chars().peekable();
    let mut in_class = false;
    // Where a class's first character is: ECMA's `[]` and `[^]` differ from the engine's.
    let mut class_start = false;
    while let Some(c) = chars.next() {
        let first = std::mem::take(&mut class_start);
        match c {
            '\\' => {
                let e = chars.next()?;
                out.push_str(&escape(e, in_class, &mut chars)?);
            }
            '[' if !in_class => {
                in_class = true;
                out.push('[');
                if chars.peek() == Some(&'^') {
                    chars.next();
                    out.push('^');
                }
                class_start = true;
            }
            ']' if in_class && first => return None,
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            // The engine's class syntax: nested classes and set operations.
            '[' | '&' | '~' if in_class => {
                out.push('\\');
                out.push(c);
            }
            '-' if in_class && chars.peek() == Some(&'-') => out.push_str(r"\-"),
            '.' if !in_class => out.push_str(r"[^\n\r\x{2028}\x{2029}]"),
            c => out.push(c),
        }
    }
    (!in_class).then_some(out)
}

/// The escape `\e` in the engine's syntax (`rest` follows it).
fn escape(
    e: char,
    in_class: bool,
    rest: &mut std::iter::Peekable<std::str::Chars<'_>>,
) -> Option<String> {
    // A class inside a class: the engine nests them.
    let class = |body: &str, negated: bool| match (in_class, negated) {
        (true, false) => body.to_owned(),
        (_, true) => format!("[^{body}]"),
        (false, false) => format!("[{body}]"),
    };
    Some(match e {
        'd' => class("0-9", false),
        'D' => class("0-9", true),
        'w' => class("A-Za-z0-9_", false),
        'W' => class("A-Za-z0-9_", true),
        's' => class(SPACE, false),
        'S' => class(SPACE, true),
        'b' if in_class => r"\x08".to_owned(),
        'b' => r"(?-u:\b)".to_owned(),
        'B' if !in_class => r"(?-u:\B)".to_owned(),
        't' => r"\t".to_owned(),
        'n' => r"\n".to_owned(),
        'r' => r"\r".to_owned(),
        'f' => r"\x0C".to_owned(),
        'v' => r"\x0B".to_owned(),
        '0' if !rest.peek().is_some_and(char::is_ascii_digit) => r"\x00".to_owned(),
        'x' => {
            let hex: String = (0..2).filter_map(|_| rest.next()).collect();
            u32::from_str_radix(&hex, 16)
                .ok()
                .filter(|_| hex.len() == 2)?;
            format!(r"\x{{{hex}}}")
        }
        'u' => {
            let hex: String = (0..4).filter_map(|_| rest.next()).collect();
            u32::from_str_radix(&hex, 16)
                .ok()
                .filter(|_| hex.len() == 4)?;
            format!(r"\x{{{hex}}}")
        }
        'c' => {
            let letter = rest.next().filter(char::is_ascii_alphabetic)?;
            format!(r"\x{{{:X}}}", u32::from(letter) % 32)
        }
        // Any other punctuation stands for itself.
        p if p.is_ascii_punctuation() => regex::escape(&p.to_string()),
        // Backreferences, named groups' references, Unicode properties, and the rest.
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn ecma_classes_keep_their_ascii_meaning() {
        assert_eq!(matches(r"^\d{3}$", "123"), Some(true));
        // An Arabic-Indic digit is no ECMA `\d`, so it is among `[^\d]`.
        assert_eq!(matches(r"^\d+$", "\u{663}"), Some(false));
        assert_eq!(matches(r"^[^\d]+$", "\u{663}"), Some(true));
        assert_eq!(matches(r"^\w+$", "é"), Some(false));
        assert_eq!(matches(r"^[\w-]+$", "a-b_c"), Some(true));
        assert_eq!(matches(r"^\s$", "\u{3000}"), Some(true));
        assert_eq!(matches(r"^a.b$", "a\nb"), Some(false));
        assert_eq!(matches(r"^a.b$", "a\u{2028}b"), Some(false));
        assert_eq!(
            matches(r"^.{2}$", "éé"),
            Some(true),
            "characters, not bytes"
        );
        assert_eq!(matches(r"\bcat\b", "a cat!"), Some(true));
        assert_eq!(matches(r"\bcat\b", "concatenate"), Some(false));
        assert_eq!(
            matches(r"^[[a]+$", "[a["),
            Some(true),
            "a [ in a class is literal"
        );
        assert_eq!(matches(r"^[a&&b]+$", "a&b"), Some(true));
        assert_eq!(matches(r"^\/api\/v\d$", "/api/v2"), Some(true));
        assert_eq!(matches(r"^\u00e9\x41$", "éA"), Some(true));
        // Unanchored, as ECMA's `test`.
        assert_eq!(matches(r"b+", "abbbc"), Some(true));
    }

    #[test]
    fn what_the_engine_lacks_is_left_unchecked() {
        for p in [
            r"^(?=a)a$",
            r"^(a)\1$",
            r"^\p{L}+$",
            r"[]",
            r"[a",
            r"\k<n>",
            r"\q",
            r"((((((((((a{100}){100}){100}){100})))))))",
        ] {
            assert_eq!(matches(p, "a"), None, "{p}");
        }
    }

    /// The pattern that hangs a backtracking engine on this input (exponential in its
    /// length) is answered here in one pass; a backtracking engine would not return.
    #[test]
    fn a_catastrophic_pattern_does_not_hang() {
        let text = format!("{}!", "a".repeat(20_000));
        assert_eq!(matches(r"^(a+)+$", &text), Some(false));
        assert_eq!(matches(r"^(a|a)*$", &text), Some(false));
    }
}
