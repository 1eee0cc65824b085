//! The one thing the proxy reads of TLS: the ClientHello's server name (SNI), and whether the
//! hello is encrypted (ECH), so a CONNECT to an allowed host cannot carry another host's
//! traffic (domain fronting).

use std::io::Read;

/// What a ClientHello says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The `server_name` extension's host name, lowercased.
    pub sni: Option<String>,
    /// An `encrypted_client_hello` extension is present (its real name is hidden).
    pub ech: bool,
}

/// The largest ClientHello read (a post-quantum key share makes one about 2 KiB).
const MAX_HELLO: usize = 64 * 1024;
const HANDSHAKE: u8 = 0x16;
const CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const EXT_ECH: u16 = 0xfe0d;

/// Reads TLS records from `r` until the first handshake message (the ClientHello) is whole;
/// the bytes read, to forward as they were, and what the hello says. `None` when what comes is
/// not a TLS ClientHello.
pub(crate) fn read_client_hello(r: &mut impl Read) -> std::io::Result<(Vec<u8>, Option<Hello>)> {
    let mut raw = Vec::new();
    let mut handshake = Vec::new();
    loop {
        let mut head = [0u8; 5];
        r.read_exact(&mut head)?;
        raw.extend_from_slice(&head);
        let len = usize::from(u16::from_be_bytes([head[3], head[4]]));
        if head[0] != HANDSHAKE || len == 0 || raw.len() + len > MAX_HELLO {
            return Ok((raw, None));
        }
        let start = raw.len();
        raw.resize(start + len, 0);
        r.read_exact(&mut raw[start..])?;
        handshake.extend_from_slice(&raw[start..]);
        if handshake.len() >= 4 {
            if handshake[0] != CLIENT_HELLO {
                return Ok((raw, None));
            }
            let need = 4
                + (usize::from(handshake[1]) << 16
                    | usize::from(handshake[2]) << 8
                    | usize::from(handshake[3]));
            if need > MAX_HELLO {
                return Ok((raw, None));
            }
            if handshake.len() >= need {
                return Ok((raw, parse(&handshake[4..need])));
            }
        }
    }
}

/// A cursor over a message that fails (None) instead of reading past its end.
struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    /// A vector with a 1- or 2-byte length prefix.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }

    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// The ClientHello body (after the handshake header).
fn parse(body: &[u8]) -> Option<Hello> {
    let mut c = Cur(body);
    c.take(2 + 32)?; // legacy_version, random
    c.vec8()?; // legacy_session_id
    c.vec16()?; // cipher_suites
    c.vec8()?; // legacy_compression_methods
    let mut hello = Hello {
        sni: None,
        ech: false,
    };
    if c.0.is_empty() {
        return Some(hello);
    }
    let mut exts = Cur(c.vec16()?);
    while !exts.0.is_empty() {
        let ty = exts.u16()? as u16;
        let data = exts.vec16()?;
        match ty {
            EXT_SERVER_NAME => {
                let mut list = Cur(Cur(data).vec16()?);
                while !list.0.is_empty() {
                    let kind = list.u8()?;
                    let name = list.vec16()?;
                    if kind == 0 {
                        // Two host names is no hello a client sends.
                        if hello.sni.is_some() {
                            return None;
                        }
                        let name = std::str::from_utf8(name).ok()?;
                        hello.sni = Some(name.trim_end_matches('.').to_ascii_lowercase());
                    }
                }
            }
            EXT_ECH => hello.ech = true,
            _ => {}
        }
    }
    Some(hello)
}

/// A minimal ClientHello record naming `sni` (and an ECH extension when `ech`), for tests.
#[cfg(test)]
pub(crate) fn client_hello(sni: Option<&str>, ech: bool) -> Vec<u8> {
    let mut exts = Vec::new();
    if let Some(name) = sni {
        let n = name.len();
        exts.extend([0, 0]);
        exts.extend(((n + 5) as u16).to_be_bytes());
        exts.extend(((n + 3) as u16).to_be_bytes());
        exts.push(0);
        exts.extend((n as u16).to_be_bytes());
        exts.extend(name.as_bytes());
    }
    if ech {
        exts.extend([0xfe, 0x0d, 0, 1, 0]);
    }
    let mut body = vec![3, 3];
    body.extend([7u8; 32]);
    body.push(0);
    body.extend([0, 2, 0x13, 0x01]);
    body.extend([1, 0]);
    body.extend((exts.len() as u16).to_be_bytes());
    body.extend(exts);
    let mut hs = vec![CLIENT_HELLO];
    hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend(body);
    let mut rec = vec![HANDSHAKE, 3, 1];
    rec.extend((hs.len() as u16).to_be_bytes());
    rec.extend(hs);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_name_and_ech_are_read_and_garbage_is_no_hello() {
        let rec = client_hello(Some("Pypi.Org"), false);
        let (raw, hello) = read_client_hello(&mut &rec[..]).expect("read");
        assert_eq!(raw, rec, "the bytes to forward are the bytes read");
        assert_eq!(
            hello,
            Some(Hello {
                sni: Some("pypi.org".into()),
                ech: false
            })
        );
        let (_, hello) = read_client_hello(&mut &client_hello(None, true)[..]).expect("read");
        assert_eq!(
            hello,
            Some(Hello {
                sni: None,
                ech: true
            })
        );
        // Split across two records.
        let whole = client_hello(Some("a.test"), false);
        let hs = &whole[5..];
        let mut split = vec![HANDSHAKE, 3, 1, 0, 10];
        split.extend(&hs[..10]);
        split.extend([HANDSHAKE, 3, 1]);
        split.extend(((hs.len() - 10) as u16).to_be_bytes());
        split.extend(&hs[10..]);
        let (_, hello) = read_client_hello(&mut &split[..]).expect("read");
        assert_eq!(hello.and_then(|h| h.sni).as_deref(), Some("a.test"));
        let (_, hello) = read_client_hello(&mut &b"GET / HTTP/1.1\r\n\r\n"[..]).expect("read");
        assert_eq!(hello, None);
        // Cut short: an error, not a hello.
        assert!(read_client_hello(&mut &whole[..whole.len() - 3]).is_err());
        // A length past the message: no hello.
        let mut lying = whole.clone();
        let last = lying.len() - 1;
        lying[last - 7] = 0xff;
        let (_, hello) = read_client_hello(&mut &lying[..]).expect("read");
        assert!(hello.is_none_or(|h| h.sni.as_deref() != Some("a.test")));
    }
}
