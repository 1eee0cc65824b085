//! [`AppliedPolicy`]: how a tool's runs are confined, as the planner decided it and as
//! `tool.execution_started` (and `mcp.server_started`) record it. One type, serialized as is,
//! so a renamed field is a compile error rather than a silent change of the record.

use super::options::{IsolationMode, ResourceLimits};
use serde::Serialize;

/// The confinement a tool's runs get, or why they are all refused. Serialized into the events
/// that start a run (`isolation`): `{"mode", "landlock_abi", "filesystem", "network", ...}`,
/// or `{"mode": "required", "refused": why}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum AppliedPolicy {
    /// What every run gets.
    Applied(Box<Applied>),
    /// The kernel cannot meet the `required` policy: every run is refused.
    Refused {
        /// The mode asked for.
        mode: IsolationMode,
        /// Why, naming the missing feature and what to set instead.
        refused: String,
    },
}

/// Every layer of a run's confinement, as applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// The mode asked for.
    pub mode: IsolationMode,
    /// The Landlock ABI used (the kernel's, or less under a test hook); 0 without Landlock.
    pub landlock_abi: u32,
    /// Landlock's filesystem rules; `null` without Landlock.
    pub filesystem: Option<Filesystem>,
    /// The filesystem the run sees: built for it, or the host's.
    pub view: View,
    /// The run's network.
    pub network: Network,
    /// Whom the run executes as; `null` in mode `none`.
    pub identity: Option<Identity>,
    /// What is left of the capabilities.
    pub capabilities: Capabilities,
    /// `PR_SET_NO_NEW_PRIVS`: exec cannot raise privileges.
    pub no_new_privs: bool,
    /// Whether device nodes can be made.
    pub devices: Devices,
    /// The namespaces the run has of its own.
    pub namespaces: Namespaces,
    /// How SysV IPC is kept from the host's.
    pub ipc: Ipc,
    /// The syscalls the floor refuses; `null` without a seccomp filter.
    pub syscall_floor: Option<Vec<&'static str>>,
    /// Landlock's scopes.
    pub scopes: Scopes,
    /// The resource limits; `null` in mode `none`.
    pub limits: Option<Limits>,
    /// How the run is contained (`pid_namespace`, `user_and_pid_namespace`, `subreaper`).
    pub containment: &'static str,
    /// Whether processes the run detaches are killed with it.
    pub orphans_killed: bool,
    /// Whether the run cannot kill its own supervisor (which would orphan the rest): it cannot
    /// see it from a PID namespace, nor signal it with Landlock's signal scope.
    pub supervisor_protected: bool,
}

/// Landlock's filesystem rules.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Filesystem {
    /// Read and execute: the system directories, the executables' directories, `read_paths`.
    pub read_exec: Vec<String>,
    /// The device files a program reads and writes.
    pub devices: &'static [&'static str],
    /// Read and write: the working dirs.
    pub read_write: Vec<String>,
    /// The run has a private temp directory of its own.
    pub private_tmp: bool,
    /// Truncation is a right of its own (ABI 3).
    pub truncate_handled: bool,
}

/// The filesystem a run sees.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct View {
    /// `tool` (built once, when the tool was built, in its mount namespace), `run` (built for
    /// each run, in its own), or `none` (the run walks the host's tree, filtered by Landlock).
    pub built: &'static str,
    /// What is in it, in the order it was built; empty with `built: "none"`.
    pub mounts: Vec<ViewMount>,
    /// `own` (a procfs of the run's PID namespace: only its processes), or `none` (no `/proc`).
    pub proc: &'static str,
    /// Why there is no view (or no `/proc` in it), where one was possible to want.
    pub fallback: Option<String>,
}

/// One path of a run's view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ViewMount {
    /// Where it is in the view (its own absolute path).
    pub path: String,
    /// The host path bound there; `null` for a symlink or a directory of the view.
    pub from: Option<String>,
    /// `read_only`, `read_write` (idmapped for the run on a root host where
    /// `working_dirs_idmapped`), `device` or `symlink` (to `target`).
    pub access: &'static str,
    /// A symlink's target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// The run's network, in one of three shapes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Network {
    /// Only the hosts of an allowlist, through the run's proxy.
    Allowlist(Box<AllowlistNetwork>),
    /// The loopback of a network namespace of the run's own.
    Loopback(LoopbackNetwork),
    /// None, or all of it.
    Plain(PlainNetwork),
}

/// An allowlist's network as applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AllowlistNetwork {
    /// Always `allowlist`.
    pub mode: &'static str,
    /// The allowed host patterns.
    pub allow: Vec<String>,
    /// The denied host patterns.
    pub deny: Vec<String>,
    /// Whether private addresses may be reached.
    pub allow_private: bool,
    /// Names resolved to fixed addresses.
    pub resolve: std::collections::BTreeMap<String, std::net::IpAddr>,
    /// Connections a run may open in all.
    pub max_connections: u32,
    /// Bytes a run may move in all.
    pub max_bytes: u64,
    /// `network_namespace` or `seccomp_user_notification`.
    pub enforced_by: &'static str,
    /// The proxy's address in the run.
    pub proxy: String,
    /// The filter admits TCP sockets only.
    pub seccomp_tcp_only: bool,
    /// Landlock's TCP connect rule: the ports the run may connect to (none when mediated:
    /// correx makes its connects); `null` without Landlock's network rules.
    pub landlock_tcp_connect: Option<Vec<u16>>,
}

/// A loopback network as applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoopbackNetwork {
    /// Always `loopback`.
    pub mode: &'static str,
    /// Always `network_namespace`.
    pub enforced_by: &'static str,
    /// What the run reaches.
    pub reach: &'static str,
    /// The filter admits IP and netlink sockets and socketpairs only.
    pub seccomp_inet_only: bool,
}

/// No network, or all of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlainNetwork {
    /// `off` or `open`.
    pub mode: &'static str,
    /// Whether the run reaches the network.
    pub allowed: bool,
    /// The filter admits `AF_UNIX` sockets only.
    pub seccomp_af_unix_only: bool,
    /// UNIX datagram sockets are refused.
    pub unix_datagram_denied: bool,
    /// Landlock refuses TCP bind and connect.
    pub landlock_tcp_denied: bool,
    /// Why the run got no network where it asked for some.
    pub fallback: Option<&'static str>,
}

/// Whom a run executes as.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Identity {
    /// The uid.
    pub uid: u32,
    /// The gid.
    pub gid: u32,
    /// `host_user`, `unprivileged` or `host_root`.
    pub run_as: &'static str,
    /// The working dirs are idmapped for the run.
    pub working_dirs_idmapped: bool,
    /// Why the run keeps the host's uid, when it was asked not to.
    pub fallback: Option<String>,
}

/// What is left of a run's capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Capabilities {
    /// The host's (mode `none`).
    Host,
    /// None at all.
    None,
    /// Effective, permitted, inheritable and ambient are empty; the bounding set cannot be
    /// emptied without CAP_SETPCAP, and no_new_privs keeps it unusable.
    NoneButBoundingSet,
}

/// Whether a run can make device nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Devices {
    /// Landlock refuses `mknod`.
    MknodDenied,
    /// As the host allows.
    Host,
}

/// How a run's SysV IPC is kept from the host's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ipc {
    /// Not kept.
    Host,
    /// An IPC namespace of its own.
    OwnNamespace,
    /// The seccomp filter refuses it.
    SeccompDenied,
}

/// The namespaces a run has of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Namespaces {
    /// PID.
    pub pid: bool,
    /// User.
    pub user: bool,
    /// Mount.
    pub mount: bool,
    /// Network.
    pub net: bool,
    /// UTS (host name).
    pub uts: bool,
    /// IPC.
    pub ipc: bool,
}

/// Landlock's scopes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Scopes {
    /// Signals reach only the run's own processes.
    pub signal: bool,
    /// Abstract UNIX sockets reach only the run's own.
    pub abstract_unix_socket: bool,
}

/// A run's resource limits as applied: the configured ones, and how the process count is
/// bounded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// The limits as configured (recorded beside the rest, not nested).
    #[serde(flatten)]
    pub configured: ResourceLimits,
    /// Whether `max_processes` is enforced.
    pub max_processes_enforced: bool,
    /// How: `rlimit_nproc_in_user_namespace`, `cgroup_pids_max` or `none`.
    pub process_bound: &'static str,
    /// `run`, or `tool` (concurrent runs of this tool share the bound; a run alone has all of
    /// it), or `none`.
    pub process_bound_scope: &'static str,
    /// Always false: core dumps are off.
    pub core_dumps: bool,
}

impl AppliedPolicy {
    /// The policy as recorded in an event's payload.
    pub fn to_json(&self) -> serde_json::Value {
        // A struct of strings, numbers, bools and maps with string keys always serializes.
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}
