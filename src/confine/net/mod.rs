//! Network by name for confined runs: the policy (`false`, `true`, or an allowlist of hosts),
//! and the proxy a run with an allowlist reaches the network through.
//!
//! Such a run gets a network namespace of its own with only loopback in it, where its
//! supervisor listens on `127.0.0.1:3128` and hands the listener to the host: the proxy is the
//! only thing it can reach. Its seccomp filter admits TCP sockets only (no UDP, so no DNS of
//! its own), and where Landlock has network rules (ABI 4) it may connect to port 3128 alone.
//!
//! Where no network namespace can be made, the run shares the host's network and its filter
//! holds every `connect` for correx, which puts a socket of its own, connected to the proxy,
//! in place of the run's, or refuses ([`crate::sys::mediate`]); Landlock then lets the run
//! connect nowhere on its own.

mod http1;
mod policy;
pub(crate) mod proxy;
mod tls;

pub use policy::{Allowlist, NetworkPolicy};
pub(crate) use policy::{Host, Rules};
pub(crate) use proxy::{RunProxy, PROXY_PORT};

/// The variables that point a run's clients at its proxy; a config cannot set them.
pub(crate) const PROXY_VARIABLES: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// The proxy variables' values for a run.
pub(crate) fn proxy_environment() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    PROXY_VARIABLES
        .iter()
        .map(|k| {
            let v = if k.eq_ignore_ascii_case("no_proxy") {
                String::new()
            } else {
                url.clone()
            };
            ((*k).to_owned(), v)
        })
        .collect()
}
