//! The policy a spawned llama-server was confined with, as `model.loaded` records it
//! (`isolation`): one type, serialized as is, like the shell's
//! [`AppliedPolicy`](crate::AppliedPolicy), so a renamed field is a compile error.

use crate::confine::applied::{Scopes, View};
use serde::Serialize;

/// A server's confinement: every layer as applied, or fenced only (`{"mode": "none"}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub(super) enum ServerPolicy {
    /// Confined (`required` or `best_effort`).
    Confined(Box<Confined>),
    /// Fenced only: a cleared environment, no inherited descriptors, its own process group.
    Fenced {
        /// Always `none`.
        mode: &'static str,
    },
}

/// Every layer of a confined server, as applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(super) struct Confined {
    /// `required` or `best_effort`.
    pub mode: &'static str,
    /// The kernel's Landlock ABI; 0 without Landlock.
    pub landlock_abi: u32,
    /// Landlock's filesystem rules; `null` without Landlock.
    pub filesystem: Option<Files>,
    pub network: Network,
    pub scopes: Scopes,
    /// The shell's syscall floor (SysV IPC refused too).
    pub syscall_floor: bool,
    /// `seccomp_denied` or `host`.
    pub ipc: &'static str,
    /// The uid it runs as (the host's).
    pub uid: u32,
    /// `none` (root empties its bounding set) or `none_but_bounding_set`.
    pub capabilities: &'static str,
    pub no_new_privs: bool,
    pub limits: Limits,
    /// It offloads to a GPU (its device nodes and driver files are granted).
    pub gpu_devices: bool,
    /// The filesystem it sees (`built: "server"`, or `none` with the reason).
    pub view: View,
}

/// What Landlock lets a server read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(super) struct Files {
    /// Read and execute: its binary's directory and the system libraries.
    pub read_exec: Vec<String>,
    /// Read: the model, `/etc/ld.so.cache`, the CPU topology, the files its arguments name.
    pub read: Vec<String>,
    /// Always empty: it writes nothing.
    pub read_write: Vec<String>,
}

/// A server's network.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(super) struct Network {
    /// Its own port.
    pub tcp_bind: Vec<u16>,
    /// The ports of its `--rpc` helpers (Landlock rules name ports, not hosts: on any host).
    pub tcp_connect_ports: Vec<u16>,
    /// Landlock enforces the two above (ABI 4).
    pub landlock_tcp: bool,
    /// `["inet", "inet6", "netlink"]` with the seccomp filter, else `"any"`.
    pub socket_families: Families,
}

/// The socket families a server may make.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub(super) enum Families {
    /// These only.
    Only(&'static [&'static str]),
    /// Any (`"any"`).
    Any(&'static str),
}

/// A server's resource limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(super) struct Limits {
    /// Twice the model's estimate plus a margin; `null` when it offloads to a GPU.
    pub address_space_bytes: Option<u64>,
    /// Always false.
    pub core_dumps: bool,
}

impl ServerPolicy {
    /// The policy as recorded in `model.loaded`.
    pub fn to_json(&self) -> serde_json::Value {
        // Strings, numbers, bools and lists of them always serialize.
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_record_keeps_the_shape_model_loaded_had_as_hand_built_json() {
        let view = View {
            built: "server",
            mounts: Vec::new(),
            proc: "none",
            fallback: None,
        };
        let p = ServerPolicy::Confined(Box::new(Confined {
            mode: "required",
            landlock_abi: 6,
            filesystem: Some(Files {
                read_exec: vec!["/usr".into()],
                read: vec!["/m.gguf".into()],
                read_write: Vec::new(),
            }),
            network: Network {
                tcp_bind: vec![8080],
                tcp_connect_ports: vec![50052],
                landlock_tcp: true,
                socket_families: Families::Only(&["inet", "inet6", "netlink"]),
            },
            scopes: Scopes {
                signal: true,
                abstract_unix_socket: true,
            },
            syscall_floor: true,
            ipc: "seccomp_denied",
            uid: 0,
            capabilities: "none",
            no_new_privs: true,
            limits: Limits {
                address_space_bytes: None,
                core_dumps: false,
            },
            gpu_devices: true,
            view,
        }));
        assert_eq!(
            p.to_json(),
            json!({
                "mode": "required", "landlock_abi": 6,
                "filesystem": {"read_exec": ["/usr"], "read": ["/m.gguf"], "read_write": []},
                "network": {"tcp_bind": [8080], "tcp_connect_ports": [50052], "landlock_tcp": true,
                            "socket_families": ["inet", "inet6", "netlink"]},
                "scopes": {"signal": true, "abstract_unix_socket": true},
                "syscall_floor": true, "ipc": "seccomp_denied", "uid": 0, "capabilities": "none",
                "no_new_privs": true, "limits": {"address_space_bytes": null, "core_dumps": false},
                "gpu_devices": true,
                "view": {"built": "server", "mounts": [], "proc": "none", "fallback": null},
            })
        );
        assert_eq!(
            ServerPolicy::Fenced { mode: "none" }.to_json(),
            json!({"mode": "none"})
        );
        assert_eq!(
            serde_json::to_value(Families::Any("any")).unwrap_or_default(),
            json!("any")
        );
    }
}
