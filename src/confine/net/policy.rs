//! What a run may reach (config `tools.shell.isolation.network`): nothing, everything, or the
//! hosts of an allowlist, through the run's proxy.

use crate::settings::{self, ConfigError};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

/// A run's network (config `network`: `false`, `true`, `"loopback"`, or an allowlist object).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NetworkPolicy {
    /// No socket but `AF_UNIX` (config `false`, the default).
    #[default]
    Off,
    /// Every address (config `true`).
    Open,
    /// A network of the run's own with only loopback in it (config `"loopback"`): the run may
    /// listen and connect on 127.0.0.1 and ::1 among its own processes (a dev server and the
    /// tests against it, in one run or one background job) and reaches nothing else, not the
    /// host's loopback either.
    Loopback,
    /// Only the allowlist's hosts, through a proxy correx runs for the run; the run reaches
    /// nothing else (config `{"allow": [...], ...}`).
    Allowlist(Allowlist),
}

impl NetworkPolicy {
    /// Whether the run may open network sockets at all (its own, or to the proxy).
    pub fn any(&self) -> bool {
        !matches!(self, NetworkPolicy::Off)
    }

    /// The allowlist, when the network goes through the proxy.
    pub fn allowlist(&self) -> Option<&Allowlist> {
        match self {
            NetworkPolicy::Allowlist(a) => Some(a),
            _ => None,
        }
    }
}

impl From<bool> for NetworkPolicy {
    fn from(open: bool) -> Self {
        if open {
            NetworkPolicy::Open
        } else {
            NetworkPolicy::Off
        }
    }
}

/// The hosts a run may reach through its proxy, and its bounds.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Allowlist {
    /// Hosts that may be reached: `pypi.org`, `*.crates.io` (any subdomain, not the name
    /// itself), `github.com:443`, `dev.test:*` (every port); without a port, 80 and 443. An
    /// IP address is reached only when listed itself.
    pub allow: Vec<String>,
    /// Hosts that may not be reached, though allowed (same patterns; without a port, every
    /// port). Deny wins.
    pub deny: Vec<String>,
    /// Let allowed names resolve to loopback, private, link-local or other non-public
    /// addresses (default false: such a name is refused, so DNS cannot point a name at the
    /// host's own services or a cloud's metadata).
    pub allow_private: bool,
    /// Names pinned to an address, like curl's `--resolve`; a pinned address may be private.
    pub resolve: BTreeMap<String, IpAddr>,
    /// Connections a run may open through the proxy, in all; default 256.
    pub max_connections: u32,
    /// Bytes a run may move through the proxy, both ways together; default 1 GiB.
    pub max_bytes: u64,
}

impl Default for Allowlist {
    fn default() -> Self {
        Allowlist {
            allow: Vec::new(),
            deny: Vec::new(),
            allow_private: false,
            resolve: BTreeMap::new(),
            max_connections: 256,
            max_bytes: 1 << 30,
        }
    }
}

impl<'de> Deserialize<'de> for NetworkPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Spelling;
        impl<'de> Visitor<'de> for Spelling {
            type Value = NetworkPolicy;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("false, true, \"loopback\" or {\"allow\": [hosts], ...}")
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<NetworkPolicy, E> {
                Ok(NetworkPolicy::from(b))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<NetworkPolicy, E> {
                match s {
                    "loopback" => Ok(NetworkPolicy::Loopback),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<NetworkPolicy, A::Error> {
                Allowlist::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(NetworkPolicy::Allowlist)
            }
        }
        d.deserialize_any(Spelling)
    }
}

/// A host pattern: a name (`*.` for its subdomains) or an address, and the ports it covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pattern {
    host: HostPattern,
    /// `None`: the default ports (80 and 443 for `allow`, every port for `deny`).
    port: Option<u16>,
    /// `host:*`: every port.
    any_port: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    Subdomains(String),
    Address(IpAddr),
}

impl Pattern {
    /// Parses `host`, `*.host`, `host:port`, `host:*` (every port), `1.2.3.4:443` or
    /// `[::1]:443`.
    pub(crate) fn parse(text: &str) -> Result<Pattern, String> {
        let (text, any_port) = match text.strip_suffix(":*") {
            Some(head) => (head, true),
            None => (text, false),
        };
        let (host, port) = split_port(text)?;
        if any_port && port.is_some() {
            return Err(format!("{text:?}:*: two ports"));
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let host = if let Ok(ip) = host.parse::<IpAddr>() {
            HostPattern::Address(ip)
        } else if let Some(rest) = host.strip_prefix("*.") {
            valid_name(rest)?;
            HostPattern::Subdomains(rest.to_owned())
        } else {
            valid_name(&host)?;
            HostPattern::Exact(host)
        };
        Ok(Pattern {
            host,
            port,
            any_port,
        })
    }

    fn covers(&self, host: &Host, port: u16, default_ports: &[u16]) -> bool {
        let port_ok = match self.port {
            _ if self.any_port => true,
            Some(p) => p == port,
            None => default_ports.is_empty() || default_ports.contains(&port),
        };
        port_ok
            && match (&self.host, host) {
                (HostPattern::Exact(p), Host::Name(n)) => p == n,
                (HostPattern::Subdomains(p), Host::Name(n)) => n
                    .strip_suffix(p.as_str())
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
                (HostPattern::Address(p), Host::Address(a)) => p == a,
                _ => false,
            }
    }
}

/// `host[:port]`, with `[v6]` brackets; a bare IPv6 address has no port.
pub(crate) fn split_port(text: &str) -> Result<(&str, Option<u16>), String> {
    let port_of = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{text:?}: {p:?} is not a port (1-65535)"))
    };
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{text:?}: an unclosed ["))?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((host, Some(port_of(p)?))),
            None if after.is_empty() => Ok((host, None)),
            None => Err(format!("{text:?}: unexpected text after ]")),
        };
    }
    match text.rsplit_once(':') {
        Some((host, p)) if !host.contains(':') => Ok((host, Some(port_of(p)?))),
        _ => Ok((text, None)),
    }
}

/// A DNS name: labels of letters, digits, `-` and `_`, each 1-63 bytes, 253 at most.
fn valid_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?} is not a host name"))
    }
}

/// A host a request names: a (lowercased) name or an address literal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Host {
    Name(String),
    Address(IpAddr),
}

impl Host {
    /// The host of a request: `[v6]` unbracketed, a name lowercased without its final dot.
    pub(crate) fn parse(text: &str) -> Option<Host> {
        let bare = text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(text);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Some(Host::Address(ip));
        }
        let name = bare.trim_end_matches('.').to_ascii_lowercase();
        valid_name(&name).ok().map(|()| Host::Name(name))
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Address(IpAddr::V6(a)) => write!(f, "[{a}]"),
            Host::Address(a) => write!(f, "{a}"),
        }
    }
}

/// Why the proxy refused a connection; the recorded spelling is [`Refusal::as_str`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No allow pattern covers the host and port.
    NotAllowed,
    /// A deny pattern covers it.
    Denied,
    /// An address literal no pattern lists.
    AddressLiteral,
    /// The name resolves to a non-public address.
    PrivateAddress,
    /// The name does not resolve.
    Unresolved,
    /// The TLS ClientHello names another host than the CONNECT.
    SniMismatch,
    /// The ClientHello names no host, or is not TLS.
    NoSni,
    /// The ClientHello is encrypted (ECH): its real host cannot be checked.
    EncryptedClientHello,
    /// A plain request's Host header names another host than its URL.
    HostMismatch,
    /// Bytes after a plain request's end on its connection (a second request, pipelined or
    /// after the answer): never passed on, the connection closed.
    Pipelined,
    /// The run opened its allowed number of connections.
    TooManyConnections,
    /// The run moved its allowed number of bytes.
    ByteLimit,
    /// The request is not one the proxy reads (not HTTP, an origin-form URL, not `http://`).
    BadRequest,
    /// The allowed host could not be reached.
    Unreachable,
    /// A connect straight to an address, not to the proxy (seen where correx makes the run's
    /// connects; in a network namespace the kernel refuses it unseen).
    Direct,
}

impl Refusal {
    /// As recorded in `tool.network_denied`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refusal::NotAllowed => "not_allowed",
            Refusal::Denied => "denied",
            Refusal::AddressLiteral => "address_literal",
            Refusal::PrivateAddress => "private_address",
            Refusal::Unresolved => "unresolved",
            Refusal::SniMismatch => "sni_mismatch",
            Refusal::NoSni => "no_sni",
            Refusal::EncryptedClientHello => "encrypted_client_hello",
            Refusal::Direct => "direct_connect",
            Refusal::HostMismatch => "host_mismatch",
            Refusal::Pipelined => "pipelined",
            Refusal::TooManyConnections => "too_many_connections",
            Refusal::ByteLimit => "byte_limit",
            Refusal::BadRequest => "bad_request",
            Refusal::Unreachable => "unreachable",
        }
    }
}

/// An allowlist, parsed once when the tool is built.
#[derive(Debug)]
pub(crate) struct Rules {
    allow: Vec<Pattern>,
    deny: Vec<Pattern>,
    allow_private: bool,
    resolve: BTreeMap<String, IpAddr>,
    pub(crate) max_connections: u32,
    pub(crate) max_bytes: u64,
}

/// Ports an allow pattern without one covers.
const WEB_PORTS: &[u16] = &[80, 443];

impl Rules {
    pub(crate) fn new(a: &Allowlist) -> Result<Rules, String> {
        let parse = |list: &[String]| -> Result<Vec<Pattern>, String> {
            list.iter().map(|p| Pattern::parse(p)).collect()
        };
        Ok(Rules {
            allow: parse(&a.allow)?,
            deny: parse(&a.deny)?,
            allow_private: a.allow_private,
            resolve: a
                .resolve
                .iter()
                .map(|(k, v)| (k.trim_end_matches('.').to_ascii_lowercase(), *v))
                .collect(),
            max_connections: a.max_connections,
            max_bytes: a.max_bytes,
        })
    }

    /// Whether the patterns let the run reach `host` on `port` (before any resolving).
    pub(crate) fn check(&self, host: &Host, port: u16) -> Result<(), Refusal> {
        if self.deny.iter().any(|p| p.covers(host, port, &[])) {
            return Err(Refusal::Denied);
        }
        if self.allow.iter().any(|p| p.covers(host, port, WEB_PORTS)) {
            return Ok(());
        }
        Err(match host {
            Host::Address(_) => Refusal::AddressLiteral,
            Host::Name(_) => Refusal::NotAllowed,
        })
    }

    /// The addresses an allowed host may be reached at: a listed address itself, a pinned
    /// name's address, else what the name resolves to, every one public unless
    /// `allow_private`. Resolved once: the proxy connects to what was checked.
    pub(crate) fn addresses(&self, host: &Host, port: u16) -> Result<Vec<IpAddr>, Refusal> {
        match host {
            Host::Address(a) => Ok(vec![*a]),
            Host::Name(n) => {
                if let Some(a) = self.resolve.get(n) {
                    return Ok(vec![*a]);
                }
                use std::net::ToSocketAddrs;
                let found: Vec<IpAddr> = (n.as_str(), port)
                    .to_socket_addrs()
                    .map_err(|_| Refusal::Unresolved)?
                    .map(|s| s.ip())
                    .collect();
                if found.is_empty() {
                    return Err(Refusal::Unresolved);
                }
                // A denied address is denied under any name that resolves to it.
                if found.iter().any(|a| {
                    self.deny
                        .iter()
                        .any(|p| p.covers(&Host::Address(*a), port, &[]))
                }) {
                    return Err(Refusal::Denied);
                }
                // One private address among public ones refuses the name: a resolver that
                // answers with both could be steering the proxy at the host's services.
                if !self.allow_private && found.iter().any(|a| !is_public(*a)) {
                    return Err(Refusal::PrivateAddress);
                }
                Ok(found)
            }
        }
    }
}

impl Allowlist {
    /// Checks the patterns and bounds (`tools.shell.isolation.network`).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        for (field, list) in [("allow", &self.allow), ("deny", &self.deny)] {
            for (i, p) in list.iter().enumerate() {
                Pattern::parse(p).map_err(|e| ConfigError::new(format!("{field}[{i}]"), e))?;
            }
        }
        for name in self.resolve.keys() {
            valid_name(name.trim_end_matches('.').to_ascii_lowercase().as_str())
                .map_err(|e| ConfigError::new(format!("resolve.{name}"), e))?;
        }
        settings::positive("max_connections", u64::from(self.max_connections))?;
        settings::positive("max_bytes", self.max_bytes)
    }
}

/// Whether `a` is an address of the public internet: not loopback, private, link-local
/// (cloud metadata, 169.254.169.254), shared (100.64/10), unspecified, multicast, reserved,
/// documentation or benchmarking space, nor an IPv6 form of one (mapped, NAT64, 6to4,
/// unique-local fc00::/7 with fd00:ec2::254, site-local).
pub(crate) fn is_public(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            if let Some(v4) = v6.to_ipv4_mapped() {
                return public_v4(v4);
            }
            // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) carry an IPv4 address.
            if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
                let o = v6.octets();
                return public_v4(std::net::Ipv4Addr::new(o[12], o[13], o[14], o[15]));
            }
            // Local-use NAT64 (64:ff9b:1::/48), Teredo (2001::/32) and IPv4-translated
            // (::ffff:0:0:0/96) reach what their operator routes them to.
            if (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1)
                || (s[0] == 0x2001 && s[1] == 0)
                || (s[..4] == [0, 0, 0, 0] && s[4] == 0xffff && s[5] == 0)
            {
                return false;
            }
            if s[0] == 0x2002 {
                let o = v6.octets();
                return public_v4(std::net::Ipv4Addr::new(o[2], o[3], o[4], o[5]));
            }
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link-local
                || (s[0] & 0xffc0) == 0xfec0 // site-local
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || s[..6] == [0, 0, 0, 0, 0, 0]) // IPv4-compatible and the rest of ::/96
        }
    }
}

fn public_v4(a: std::net::Ipv4Addr) -> bool {
    let o = a.octets();
    !(a.is_loopback()
        || a.is_private()
        || a.is_link_local()
        || a.is_unspecified()
        || a.is_broadcast()
        || a.is_multicast()
        || a.is_documentation()
        || o[0] == 0 // "this network"
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // shared address space
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // benchmarking
        || o[0] >= 240) // reserved
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> Rules {
        Rules::new(&Allowlist {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
            ..Allowlist::default()
        })
        .expect("valid patterns")
    }

    fn host(s: &str) -> Host {
        Host::parse(s).expect("a host")
    }

    #[test]
    fn patterns_cover_names_subdomains_ports_and_listed_addresses() {
        let r = rules(
            &[
                "pypi.org",
                "*.crates.io",
                "github.com:22",
                "10.0.0.5:8080",
                "dev.test:*",
            ],
            &["evil.crates.io", "pypi.org:80"],
        );
        assert_eq!(r.check(&host("dev.test"), 8123), Ok(()));
        assert_eq!(r.check(&host("dev.test"), 443), Ok(()));
        assert_eq!(r.check(&host("x.dev.test"), 8123), Err(Refusal::NotAllowed));
        assert_eq!(r.check(&host("pypi.org"), 443), Ok(()));
        assert_eq!(r.check(&host("PyPI.org."), 443), Ok(()));
        assert_eq!(r.check(&host("pypi.org"), 80), Err(Refusal::Denied));
        assert_eq!(r.check(&host("pypi.org"), 8443), Err(Refusal::NotAllowed));
        assert_eq!(
            r.check(&host("www.pypi.org"), 443),
            Err(Refusal::NotAllowed)
        );
        assert_eq!(r.check(&host("static.crates.io"), 443), Ok(()));
        assert_eq!(r.check(&host("a.b.crates.io"), 80), Ok(()));
        assert_eq!(r.check(&host("crates.io"), 443), Err(Refusal::NotAllowed));
        assert_eq!(
            r.check(&host("evilcrates.io"), 443),
            Err(Refusal::NotAllowed)
        );
        assert_eq!(r.check(&host("evil.crates.io"), 443), Err(Refusal::Denied));
        assert_eq!(r.check(&host("github.com"), 22), Ok(()));
        assert_eq!(r.check(&host("github.com"), 443), Err(Refusal::NotAllowed));
        assert_eq!(r.check(&host("10.0.0.5"), 8080), Ok(()));
        assert_eq!(
            r.check(&host("10.0.0.5"), 443),
            Err(Refusal::AddressLiteral)
        );
        assert_eq!(
            r.check(&host("169.254.169.254"), 80),
            Err(Refusal::AddressLiteral)
        );
        assert_eq!(r.check(&host("[::1]"), 443), Err(Refusal::AddressLiteral));
        for bad in [
            "", "a..b", "*.", "x:0", "x:70000", "[::1", "bad host", "a/b", "x:1:*", ":*",
        ] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn non_public_addresses_are_known_in_every_form() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.0.170",
            "198.18.0.1",
            "::1",
            "::",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            "::127.0.0.1",
            "64:ff9b:1::a9fe:a9fe",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "::ffff:0:a9fe:a9fe",
        ] {
            assert!(!is_public(a.parse().expect("an address")), "{a} is public");
        }
        for a in [
            "1.1.1.1",
            "151.101.0.223",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
        ] {
            assert!(
                is_public(a.parse().expect("an address")),
                "{a} is not public"
            );
        }
    }

    #[test]
    fn pinned_names_resolve_to_their_address_even_when_private() {
        let mut a = Allowlist {
            allow: vec!["pypi.test:8080".into()],
            ..Allowlist::default()
        };
        a.resolve
            .insert("PyPI.test".into(), "127.0.0.1".parse().expect("ip"));
        let r = Rules::new(&a).expect("valid");
        assert_eq!(
            r.addresses(&host("pypi.test"), 8080),
            Ok(vec!["127.0.0.1".parse().expect("ip")])
        );
    }
}
