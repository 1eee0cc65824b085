//! How a server's revision is found: the stateless revision (2026-07-28) first, by
//! `server/discover`, with this client's version, identity and capabilities in the request's
//! `_meta` (as in every request after it); a server that answers with anything that does not
//! show a modern server (an unknown method, an HTTP refusal, no answer in
//! [`DISCOVER_WAIT`]) is a handshake-era server, spoken to by `initialize` after all. A
//! modern server that refuses the version (`-32022`) while naming it among those it supports
//! is asked once more (a server that refuses the first request it sees, as one behind a
//! balancer in front of servers of two eras may), within the same wait.

use super::connection::{RpcError, Shared};
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

/// The stateless protocol revision, asked for first (by `server/discover`); a server that
/// does not speak it is spoken to in one of [`PROTOCOL_VERSIONS`](super::PROTOCOL_VERSIONS).
pub const STATELESS_PROTOCOL_VERSION: &str = "2026-07-28";
/// How long a server gets to answer `server/discover` before it is taken for a
/// handshake-era one (some of those never answer a request before `initialize`), at most:
/// and never more than half the start's time, so that `initialize` has the rest.
const DISCOVER_WAIT: Duration = Duration::from_secs(10);
/// The JSON-RPC error a modern server gives for a version it does not speak.
const UNSUPPORTED_VERSION: i64 = -32022;

/// What `server/discover` found.
pub(crate) enum Found {
    /// A server of the stateless revision: its `server/discover` result.
    Stateless(Value),
    /// A handshake-era server.
    Handshake,
}

/// The `_meta` every stateless request carries.
pub(crate) fn meta(capabilities: &Value) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        "io.modelcontextprotocol/protocolVersion".into(),
        json!(STATELESS_PROTOCOL_VERSION),
    );
    m.insert(
        "io.modelcontextprotocol/clientInfo".into(),
        json!({"name": "correx", "version": env!("CARGO_PKG_VERSION")}),
    );
    m.insert(
        "io.modelcontextprotocol/clientCapabilities".into(),
        capabilities.clone(),
    );
    m
}

/// Asks the server for `server/discover` (within `timeout`); on [`Found::Stateless`] the
/// connection speaks the stateless revision from now on, else it is as before.
///
/// # Errors
/// The server ended, the host cancelled, or an authorization could not be had.
pub(crate) fn discover(
    shared: &Shared,
    timeout: Duration,
    capabilities: &Value,
) -> Result<Found, String> {
    shared.set_meta(Some(meta(capabilities)));
    if let Some(remote) = shared.remote() {
        remote.negotiated(STATELESS_PROTOCOL_VERSION);
    }
    let found = ask(shared, (timeout / 2).min(DISCOVER_WAIT));
    if !matches!(found, Ok(Found::Stateless(_))) {
        shared.set_meta(None);
        if let Some(remote) = shared.remote() {
            remote.forget_revision();
        }
    }
    found
}

fn ask(shared: &Shared, wait: Duration) -> Result<Found, String> {
    let deadline = Instant::now() + wait;
    for attempt in 0..2 {
        let left = deadline.saturating_duration_since(Instant::now());
        let (answer, _) = shared.request("server/discover", Map::new(), left, None, None);
        match answer {
            Ok(result) => {
                let speaks = result["supportedVersions"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|v| v == STATELESS_PROTOCOL_VERSION));
                return Ok(if speaks {
                    Found::Stateless(result)
                } else {
                    Found::Handshake
                });
            }
            Err(RpcError::Gone(why)) => {
                return Err(format!("server/discover: the server ended: {why}"))
            }
            Err(e @ (RpcError::Cancelled | RpcError::Unauthorized(_))) => {
                return Err(format!("server/discover: {e}"))
            }
            Err(RpcError::Http { message, .. }) if attempt == 0 && names_stateless(&message) => {
                continue;
            }
            Err(_) => return Ok(Found::Handshake),
        }
    }
    Ok(Found::Handshake)
}

/// Whether an HTTP refusal's body is the `-32022` of a server that names the stateless
/// revision among those it supports.
fn names_stateless(body: &str) -> bool {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return false;
    };
    v["error"]["code"].as_i64() == Some(UNSUPPORTED_VERSION)
        && v["error"]["data"]["supported"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s == STATELESS_PROTOCOL_VERSION))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_version_refusal_naming_the_stateless_revision_is_asked_again() {
        let refusal = |supported: Value| {
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32022, "message": "no",
                "data": {"supported": supported}}})
            .to_string()
        };
        assert!(names_stateless(&refusal(json!([
            STATELESS_PROTOCOL_VERSION
        ]))));
        assert!(!names_stateless(&refusal(json!(["2025-11-25"]))));
        assert!(!names_stateless(&refusal(json!(
            STATELESS_PROTOCOL_VERSION
        ))));
        assert!(!names_stateless(
            r#"{"error": {"code": -32601, "message": "x"}}"#
        ));
        assert!(!names_stateless("Invalid or missing session ID"));
    }
}
