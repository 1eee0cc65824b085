//! The plain HTTP requests of an OAuth flow (metadata documents, registration, tokens): each
//! to its own URL, through the same network policy as the server's own requests, so a
//! metadata document pointing at a private or metadata address is refused before anything
//! is sent.

use crate::cancel::CancelToken;
use crate::http::{Endpoint, HttpClient, HttpError, Request, Resolver};
use std::io::Read;
use std::time::Duration;

/// The largest metadata or token answer read.
const MAX_BODY: usize = 1 << 20;
/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(15);

/// An `http://` URL split into its origin (`http://host:port`) and its path with any query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Url {
    pub origin: String,
    pub path: String,
}

impl Url {
    /// `http://authority[/path]`; `None` for another scheme or a fragment.
    pub fn parse(url: &str) -> Option<Url> {
        let rest = url.strip_prefix("http://")?;
        if url.contains(['#', ' ', '\r', '\n']) {
            return None;
        }
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        Endpoint::parse(&format!("http://{authority}"))?;
        Some(Url {
            origin: format!("http://{authority}"),
            path: path.to_owned(),
        })
    }

    /// The path without its query and trailing slash (`""` for the root).
    pub fn bare_path(&self) -> &str {
        self.path
            .split('?')
            .next()
            .unwrap_or("")
            .trim_end_matches('/')
    }
}

/// What a request got back.
pub(crate) struct Fetched {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Sends one request to `url` through `resolver`.
///
/// # Errors
/// Why no answer came: the policy's refusal, a connection failure, a timeout, a cancel, or
/// an answer too long to read.
pub(crate) fn fetch(
    resolver: &Resolver,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    cancel: &CancelToken,
) -> Result<Fetched, String> {
    let u = Url::parse(url).ok_or_else(|| format!("{url:?} is not an http:// URL"))?;
    let endpoint = Endpoint::parse(&u.origin).ok_or_else(|| format!("{url:?} has no host"))?;
    let client = HttpClient::new(endpoint, TIMEOUT, TIMEOUT).with_resolver(resolver.clone());
    let path = if u.path.is_empty() { "/" } else { &u.path };
    let mut response = client
        .send(
            &Request {
                method,
                path,
                headers,
                body,
            },
            cancel,
            Some(TIMEOUT),
        )
        .map_err(|e| match e {
            HttpError::Cancelled => "cancelled".to_owned(),
            other => format!("{method} {}: {other}", u.origin),
        })?;
    let mut out = Vec::new();
    (&mut response)
        .take(MAX_BODY as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("{method} {}: its answer could not be read: {e}", u.origin))?;
    if out.len() > MAX_BODY {
        return Err(format!(
            "{method} {}: an answer longer than {MAX_BODY} bytes",
            u.origin
        ));
    }
    Ok(Fetched {
        status: response.status,
        body: out,
    })
}

/// `application/x-www-form-urlencoded` of `pairs`.
pub(crate) fn form(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes a query's `%XX` and `+`.
pub(crate) fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A query string's pairs, decoded.
pub(crate) fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_origin_and_path() {
        let u = Url::parse("http://localhost:8080/mcp?x=1").expect("a url");
        assert_eq!(u.origin, "http://localhost:8080");
        assert_eq!(u.path, "/mcp?x=1");
        assert_eq!(u.bare_path(), "/mcp");
        assert_eq!(Url::parse("http://h").expect("a url").bare_path(), "");
        assert!(Url::parse("https://h/").is_none());
        assert!(Url::parse("http://h/#frag").is_none());
        assert!(Url::parse("http:///x").is_none());
    }

    #[test]
    fn forms_encode_and_queries_decode() {
        assert_eq!(form(&[("a b", "c&d=é")]), "a%20b=c%26d%3D%C3%A9");
        assert_eq!(
            query_pairs("code=a%2Fb&state=x+y&bad=%zz&end=%4"),
            [
                ("code".into(), "a/b".into()),
                ("state".into(), "x y".into()),
                ("bad".into(), "%zz".into()),
                ("end".into(), "%4".into())
            ]
        );
    }
}
