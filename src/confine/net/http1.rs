//! Where a plain-HTTP request's body ends (RFC 9112 §6), so the proxy passes on exactly one
//! request and never the bytes after it: a second request on the connection (pipelined, or
//! sent after a keep-alive answer) could name another host, and a server behind a shared front
//! could route it there. The shapes two parsers may read two ways are refused: two lengths, a
//! length beside a transfer coding, a coding that does not end in `chunked`, a chunk line with
//! a bare CR or LF.

use std::io::{self, BufRead, Write};

/// How a request's body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body.
    None,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunks up to the last (size 0) and its trailer section.
    Chunked,
}

/// The framing a request head declares; `None` for one the proxy refuses.
pub(crate) fn framing(version: &str, headers: &[(&str, &str)]) -> Option<Framing> {
    let values = |name: &str| -> Vec<&str> {
        headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
            .collect()
    };
    let (lengths, codings) = (values("content-length"), values("transfer-encoding"));
    match (lengths.as_slice(), codings.as_slice()) {
        ([], []) => Some(Framing::None),
        ([n], []) => {
            let digits = !n.is_empty() && n.len() <= 19 && n.bytes().all(|b| b.is_ascii_digit());
            digits.then(|| n.parse().ok().map(Framing::Length))?
        }
        ([], [te]) if version == "HTTP/1.1" => {
            let list: Vec<String> = te
                .split(',')
                .map(|c| c.trim().to_ascii_lowercase())
                .collect();
            let chunked = list.iter().filter(|c| *c == "chunked").count();
            let last = list.last().map(String::as_str);
            (chunked == 1 && last == Some("chunked") && list.iter().all(|c| !c.is_empty()))
                .then_some(Framing::Chunked)
        }
        _ => None,
    }
}

/// The longest chunk-size or trailer line read.
const MAX_LINE: usize = 8192;

/// Copies one body framed as `framing` from `input` to `output`, calling `allow` with each
/// piece's size before it is passed on; returns the bytes passed on. What follows the body
/// stays in `input`.
///
/// # Errors
/// `InvalidData` for a malformed chunked body, `UnexpectedEof` when the input ends first,
/// `PermissionDenied` when `allow` refused; the output may hold part of the body then.
pub(crate) fn copy_body(
    framing: Framing,
    input: &mut impl BufRead,
    output: &mut impl Write,
    allow: &dyn Fn(u64) -> bool,
) -> io::Result<u64> {
    let mut pass = |bytes: &[u8]| -> io::Result<u64> {
        if !allow(bytes.len() as u64) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "byte limit",
            ));
        }
        output.write_all(bytes)?;
        Ok(bytes.len() as u64)
    };
    match framing {
        Framing::None => Ok(0),
        Framing::Length(n) => copy_exactly(input, n, &mut pass),
        Framing::Chunked => {
            let mut total = 0;
            loop {
                let line = read_line(input)?;
                let size = chunk_size(&line)?;
                total += pass(&line)?;
                if size == 0 {
                    // The trailer section, up to its empty line.
                    loop {
                        let line = read_line(input)?;
                        total += pass(&line)?;
                        if line == b"\r\n" {
                            return Ok(total);
                        }
                    }
                }
                total += copy_exactly(input, size, &mut pass)?;
                let end = read_line(input)?;
                if end != b"\r\n" {
                    return Err(invalid("a chunk's data does not end with CRLF"));
                }
                total += pass(&end)?;
            }
        }
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

fn copy_exactly(
    input: &mut impl BufRead,
    mut n: u64,
    pass: &mut impl FnMut(&[u8]) -> io::Result<u64>,
) -> io::Result<u64> {
    let mut total = 0;
    while n > 0 {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let take = buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
        total += pass(&buf[..take])?;
        input.consume(take);
        n -= take as u64;
    }
    Ok(total)
}

/// One line with its CRLF; a CR or LF anywhere else, or a control character, is refused.
fn read_line(input: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..take]);
        input.consume(take);
        if line.len() > MAX_LINE {
            return Err(invalid("a chunk line is too long"));
        }
        if done {
            break;
        }
    }
    let body = line
        .strip_suffix(b"\r\n")
        .ok_or_else(|| invalid("a bare LF in a chunked body"))?;
    if body.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(invalid("a control character in a chunked body's line"));
    }
    Ok(line)
}

/// A chunk-size line's size (hex digits, then optional `;` extensions).
fn chunk_size(line: &[u8]) -> io::Result<u64> {
    let text = std::str::from_utf8(line).map_err(|_| invalid("a chunk line is not UTF-8"))?;
    let hex = text
        .trim_end_matches("\r\n")
        .split(';')
        .next()
        .unwrap_or("");
    if hex.is_empty() || hex.len() > 15 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(invalid("a chunk size is not hex digits"));
    }
    u64::from_str_radix(hex, 16).map_err(|_| invalid("a chunk size is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(framing: Framing, input: &[u8]) -> io::Result<(Vec<u8>, Vec<u8>)> {
        let mut reader = io::BufReader::with_capacity(7, input);
        let mut out = Vec::new();
        copy_body(framing, &mut reader, &mut out, &|_| true)?;
        let mut rest = Vec::new();
        io::Read::read_to_end(&mut reader, &mut rest)?;
        Ok((out, rest))
    }

    #[test]
    fn lengths_and_codings_two_parsers_could_read_two_ways_are_refused() {
        let f = |headers: &[(&str, &str)]| framing("HTTP/1.1", headers);
        assert_eq!(f(&[]), Some(Framing::None));
        assert_eq!(f(&[("Content-Length", "12")]), Some(Framing::Length(12)));
        assert_eq!(
            f(&[("Transfer-Encoding", "gzip, Chunked")]),
            Some(Framing::Chunked)
        );
        for bad in [
            vec![("Content-Length", "12"), ("content-length", "12")],
            vec![("Content-Length", "12, 12")],
            vec![("Content-Length", "+12")],
            vec![("Content-Length", "")],
            vec![("Content-Length", "99999999999999999999")],
            vec![("Content-Length", "3"), ("Transfer-Encoding", "chunked")],
            vec![("Transfer-Encoding", "chunked, gzip")],
            vec![("Transfer-Encoding", "chunked, chunked")],
            vec![("Transfer-Encoding", "gzip")],
            vec![
                ("Transfer-Encoding", "chunked"),
                ("Transfer-Encoding", "chunked"),
            ],
            vec![("Transfer-Encoding", ", chunked")],
        ] {
            assert_eq!(f(&bad), None, "{bad:?}");
        }
        assert_eq!(
            framing("HTTP/1.0", &[("Transfer-Encoding", "chunked")]),
            None
        );
    }

    #[test]
    fn one_body_is_copied_and_what_follows_it_stays() -> io::Result<()> {
        let next = b"GET http://other.test/ HTTP/1.1\r\n\r\n";
        let mut input = b"hello".to_vec();
        input.extend_from_slice(next);
        assert_eq!(
            copy(Framing::Length(5), &input)?,
            (b"hello".to_vec(), next.to_vec())
        );
        assert_eq!(copy(Framing::None, next)?, (Vec::new(), next.to_vec()));
        let chunked = b"5;ext=1\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n";
        let mut input = chunked.to_vec();
        input.extend_from_slice(next);
        assert_eq!(
            copy(Framing::Chunked, &input)?,
            (chunked.to_vec(), next.to_vec())
        );
        let big = format!("{:x}\r\n{}\r\n0\r\n\r\n", 100_000, "a".repeat(100_000));
        assert_eq!(copy(Framing::Chunked, big.as_bytes())?.0, big.as_bytes());
        Ok(())
    }

    #[test]
    fn a_malformed_or_cut_body_is_an_error() {
        for bad in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloX\r\n0\r\n\r\n",
            b"z\r\nhello\r\n0\r\n\r\n",
            b"\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\nX: a\rb\r\n\r\n",
            b"5\r\nhel",
            b"1000000000000000\r\n",
        ] {
            assert!(
                copy(Framing::Chunked, bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            copy(Framing::Length(9), b"short").unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        let mut out = Vec::new();
        let refused = copy_body(Framing::Length(3), &mut &b"abc"[..], &mut out, &|_| false);
        assert_eq!(refused.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        assert!(out.is_empty(), "nothing passes a refusal");
    }
}
