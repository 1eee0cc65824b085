//! The network layer of a tool's plan: none, all, the run's own loopback, or only its proxy,
//! and by which route a proxied run is kept to its proxy.

use super::applied::{AllowlistNetwork, LoopbackNetwork, Network, PlainNetwork};
use super::kernel::Kernel;
use super::net::{NetworkPolicy, Rules, PROXY_PORT};
use super::options::{IsolationMode, IsolationOptions};
use crate::sys::seccomp::Sockets;
use crate::sys::spawn;
use std::sync::Arc;

/// A run's network as planned: none, all, or only its proxy.
#[derive(Debug)]
pub(crate) enum RunNetwork {
    Off,
    Open,
    /// A network namespace of the run's own with only loopback.
    Loopback,
    /// Only the run's proxy, which applies these rules, reached by this route.
    Proxied(Arc<Rules>, Route),
}

/// How a run is kept to its proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// A network namespace of the run's own, holding only loopback and the proxy's listener.
    Namespace,
    /// The host's network, with every `connect` of the run held by its seccomp filter and
    /// made by correx, to the proxy, or refused ([`crate::sys::mediate`]): where no network
    /// namespace can be made (a user without user namespaces, a container without
    /// CAP_SYS_ADMIN).
    Mediated,
}

impl Route {
    /// As recorded in the applied policy (`network.enforced_by`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Route::Namespace => "network_namespace",
            Route::Mediated => "seccomp_user_notification",
        }
    }
}

impl RunNetwork {
    /// The socket rules of the run's seccomp filter.
    pub(super) fn sockets(&self) -> Sockets {
        match self {
            RunNetwork::Off => Sockets::UnixOnly,
            RunNetwork::Open => Sockets::Any,
            // In its own namespace a run's IP sockets reach only itself; a UNIX socket could
            // still connect to a file the filesystem rules leave in reach (the user's D-Bus, an
            // SSH agent, Docker's), so it gets none but socketpairs.
            RunNetwork::Loopback => Sockets::InetOnly,
            RunNetwork::Proxied(_, Route::Namespace) => Sockets::Proxied,
            RunNetwork::Proxied(_, Route::Mediated) => Sockets::Mediated,
        }
    }

    /// The run has a network namespace of its own.
    pub(super) fn own_namespace(&self) -> bool {
        matches!(
            self,
            RunNetwork::Proxied(_, Route::Namespace) | RunNetwork::Loopback
        )
    }
}

/// Whether each run can get a network namespace of its own here.
fn namespace_works(kernel: &Kernel) -> bool {
    (kernel.root || kernel.own_user_namespace())
        && spawn::network_namespace_works(kernel.containment)
}

/// The run's network for `options`.
///
/// Network by name keeps a run to its proxy with a network namespace of its own (root makes
/// one, anyone else inside the run's own user namespace), or else by holding every connect of
/// the run in its seccomp filter and making it ourselves. Without either there is no proxy to
/// force traffic through, and a run must not get the whole network instead.
///
/// # Errors
/// In `required` mode, what the kernel lacks; in any mode, a policy that needs confinement in
/// mode `none`.
pub(super) fn plan(options: &IsolationOptions, kernel: &Kernel) -> Result<RunNetwork, String> {
    let required = options.mode == IsolationMode::Required;
    Ok(match &options.network {
        NetworkPolicy::Off => RunNetwork::Off,
        NetworkPolicy::Open => RunNetwork::Open,
        NetworkPolicy::Loopback if !kernel.confine => {
            return Err(
                "network \"loopback\" needs the run confined: set tools.shell.isolation.mode \
                 to \"required\" or \"best_effort\", or network to true"
                    .into(),
            )
        }
        // Only a namespace keeps a run off the host's loopback (its databases, its
        // agents): connects held in a filter would still reach them.
        NetworkPolicy::Loopback => {
            if namespace_works(kernel) {
                RunNetwork::Loopback
            } else if required {
                return Err(
                    "network \"loopback\" needs a network namespace for each run (run as \
                         root, or allow unprivileged user namespaces: \
                         kernel.unprivileged_userns_clone, apparmor_restrict_unprivileged_userns); \
                         or set tools.shell.isolation.network to false or true"
                        .into(),
                );
            } else {
                log::warn!("shell tool: no network namespace for loopback; runs get no network");
                RunNetwork::Off
            }
        }
        // Mode none confines nothing: a root run could leave the namespace (setns) and any
        // run could open any socket. An allowlist is a confinement; it cannot go without.
        NetworkPolicy::Allowlist(_) if !kernel.confine => {
            return Err(
                "a network allowlist needs the run confined: set tools.shell.isolation.mode to \
                 \"required\" or \"best_effort\", or network to true"
                    .into(),
            )
        }
        NetworkPolicy::Allowlist(a) => {
            if !options.mediated_forced() && namespace_works(kernel) {
                RunNetwork::Proxied(Arc::new(Rules::new(a)?), Route::Namespace)
            } else if kernel.landlock_on() && crate::sys::mediate::available() {
                // Landlock too: without it a run of the host's uid could reach into the host
                // (ptrace, pidfd_getfd) and answer its own held connects; Landlock keeps ptrace
                // within the run.
                RunNetwork::Proxied(Arc::new(Rules::new(a)?), Route::Mediated)
            } else if required {
                return Err(
                    "network by name needs a network namespace for each run (run as root, or \
                     allow unprivileged user namespaces: kernel.unprivileged_userns_clone, \
                     apparmor_restrict_unprivileged_userns), or else seccomp user \
                     notification with NOTIF_ADDFD (Linux 5.9), Landlock, and \
                     kernel.yama.ptrace_scope at most 1; or set \
                     tools.shell.isolation.network to false or true"
                        .into(),
                );
            } else {
                log::warn!("shell tool: no network namespace for a proxy; runs get no network");
                RunNetwork::Off
            }
        }
    })
}

/// Whether Landlock's TCP rules apply to the run: in a loopback namespace every port is the
/// run's own, with an open network every port is allowed, so there is nothing to keep it from.
pub(super) fn landlock_tcp(network: &RunNetwork, kernel: &Kernel) -> bool {
    kernel.landlock_on()
        && !matches!(network, RunNetwork::Open | RunNetwork::Loopback)
        && kernel.abi >= crate::sys::landlock::NET_ABI
}

/// The network as applied, for the record; `filtered` says whether the run has a seccomp
/// filter.
pub(super) fn applied(
    options: &IsolationOptions,
    network: &RunNetwork,
    kernel: &Kernel,
    filtered: bool,
) -> Network {
    let tcp = landlock_tcp(network, kernel);
    match (network, options.network.allowlist()) {
        (RunNetwork::Proxied(_, route), Some(a)) => {
            Network::Allowlist(Box::new(AllowlistNetwork {
                mode: "allowlist",
                allow: a.allow.clone(),
                deny: a.deny.clone(),
                allow_private: a.allow_private,
                resolve: a.resolve.clone(),
                max_connections: a.max_connections,
                max_bytes: a.max_bytes,
                enforced_by: route.name(),
                proxy: format!("127.0.0.1:{PROXY_PORT}"),
                seccomp_tcp_only: filtered,
                // Mediated: the run's own connects never happen (correx makes them).
                landlock_tcp_connect: match (tcp, route) {
                    (false, _) => None,
                    (true, Route::Namespace) => Some(vec![PROXY_PORT]),
                    (true, Route::Mediated) => Some(Vec::new()),
                },
            }))
        }
        (RunNetwork::Loopback, _) => Network::Loopback(LoopbackNetwork {
            mode: "loopback",
            enforced_by: "network_namespace",
            reach: "the loopback of the run's own network namespace",
            seccomp_inet_only: filtered,
        }),
        _ => {
            let open = matches!(network, RunNetwork::Open) || !kernel.confine;
            let sockets = network.sockets();
            Network::Plain(PlainNetwork {
                mode: if open { "open" } else { "off" },
                allowed: open,
                seccomp_af_unix_only: filtered && sockets == Sockets::UnixOnly,
                unix_datagram_denied: filtered && sockets != Sockets::Any,
                landlock_tcp_denied: tcp,
                fallback: match &options.network {
                    NetworkPolicy::Allowlist(_) => {
                        Some("no network namespace or seccomp user notification for a proxy")
                    }
                    NetworkPolicy::Loopback => Some("no network namespace for loopback"),
                    NetworkPolicy::Off | NetworkPolicy::Open => None,
                },
            })
        }
    }
}
