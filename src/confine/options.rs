//! The confinement's settings (config `tools.shell.isolation`, and each MCP server's
//! `isolation`): how strict, what a run may read, its network, limits and identity.

use super::net::NetworkPolicy;
use crate::settings::{self, ConfigError};
use serde::de::{self, Deserializer};
use serde::Deserialize;
use std::path::PathBuf;

/// How strictly the shell's child is confined.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IsolationMode {
    /// Every layer of the policy must be enforced by the kernel (Landlock ABI >= 3, the seccomp
    /// network filter unless `network` is set); where one is missing, every run is refused
    /// with an error naming the missing feature (and [`ShellTool::refusal`](crate::ShellTool::refusal)
    /// says so up front). The default.
    #[default]
    Required,
    /// Apply what the kernel offers and record exactly what was applied.
    BestEffort,
    /// No Landlock, seccomp or limits (the run is still contained: nothing outlives it).
    None,
}

impl IsolationMode {
    /// The config spelling: `required`, `best_effort`, `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            IsolationMode::Required => "required",
            IsolationMode::BestEffort => "best_effort",
            IsolationMode::None => "none",
        }
    }
}

/// Resource limits of one run (`setrlimit` in the child; soft and hard). `None` leaves the
/// host's limit. Core dumps are always off in a confined run. In the config
/// (`tools.shell.isolation.limits`) each is a positive number; one left out keeps its default.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourceLimits {
    /// Address space per process, bytes; default 8 GiB.
    pub address_space_bytes: Option<u64>,
    /// Largest file a process may write, bytes; default 4 GiB.
    pub file_size_bytes: Option<u64>,
    /// CPU time per process, seconds; default 600.
    pub cpu_seconds: Option<u64>,
    /// Open descriptors per process; default 1024.
    pub open_files: Option<u64>,
    /// Processes the run may have at once; default 256. Enforced as `RLIMIT_NPROC` inside the
    /// run's own user namespace (non-root hosts where unprivileged user namespaces are
    /// allowed), else as `pids.max` of a per-run cgroup where this process may create one
    /// (root with a cgroup `pids` hierarchy); elsewhere not enforced. The applied policy's
    /// `process_bound` says which.
    pub max_processes: Option<u64>,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        ResourceLimits {
            address_space_bytes: Some(8 << 30),
            file_size_bytes: Some(4 << 30),
            cpu_seconds: Some(600),
            open_files: Some(1024),
            max_processes: Some(256),
        }
    }
}

/// Whom a confined run executes as when the host runs as root (config
/// `tools.shell.isolation.run_as`). A host that is not root runs its runs as itself: it has
/// nothing to give up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunAs {
    /// An unprivileged uid and gid (default 65534 and 65534, `nobody`), so files only root may
    /// read (`/etc/shadow`, `/root`, 0600 files of root's under the read paths) stay unreadable.
    /// The working dirs are idmapped for the run: it writes there as before, and what it creates
    /// belongs to the host user.
    Unprivileged {
        /// The uid; never 0.
        uid: u32,
        /// The gid; never 0.
        gid: u32,
    },
    /// The host's own uid (root), with every capability dropped: root's own files stay
    /// readable wherever Landlock allows reading (config `"host"`).
    Host,
}

impl Default for RunAs {
    fn default() -> Self {
        RunAs::Unprivileged {
            uid: NOBODY,
            gid: NOBODY,
        }
    }
}

/// The overflow id, `nobody` on Linux distributions.
const NOBODY: u32 = 65534;

/// Settings of the shell's confinement (config `tools.shell.isolation`).
#[derive(Clone, Debug, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IsolationOptions {
    /// How strict; default [`IsolationMode::Required`].
    pub mode: IsolationMode,
    /// Directories (or files) the child may read besides the system directories; default none.
    pub read_paths: Vec<PathBuf>,
    /// The run's network: `false` (the default: only `AF_UNIX` sockets), `true` (every
    /// address), or an allowlist of hosts reached through a proxy correx runs for the run.
    pub network: NetworkPolicy,
    /// Resource limits.
    pub limits: ResourceLimits,
    /// Whom a run executes as on a root host; default [`RunAs::Unprivileged`] 65534.
    pub run_as: RunAs,
    /// Test hook (feature `test-hooks`): pretend the kernel offers at most this Landlock ABI.
    #[cfg(feature = "test-hooks")]
    #[serde(skip)]
    pub pretend_landlock_abi: Option<u32>,
    /// Test hook (feature `test-hooks`): contain runs with the subreaper even where a PID
    /// namespace is available.
    #[cfg(feature = "test-hooks")]
    #[serde(skip)]
    pub force_subreaper: bool,
    /// Test hook (feature `test-hooks`): route an allowlist's runs through seccomp user
    /// notification even where a network namespace is available.
    #[cfg(feature = "test-hooks")]
    #[serde(skip)]
    pub force_mediated_network: bool,
    /// Test hook (feature `test-hooks`): no view; runs walk the host's tree, filtered by
    /// Landlock (what a host without mount namespaces gets).
    #[cfg(feature = "test-hooks")]
    #[serde(skip)]
    pub force_no_view: bool,
}

impl IsolationOptions {
    /// The Landlock ABI a test pretends the kernel stops at.
    pub(super) fn pretended_abi(&self) -> Option<u32> {
        #[cfg(feature = "test-hooks")]
        return self.pretend_landlock_abi;
        #[cfg(not(feature = "test-hooks"))]
        None
    }

    /// Whether a test asked for the subreaper where a PID namespace would do.
    pub(super) fn subreaper_forced(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        return self.force_subreaper;
        #[cfg(not(feature = "test-hooks"))]
        false
    }

    /// Whether a test asked for a mediated network where a namespace would do.
    pub(super) fn mediated_forced(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        return self.force_mediated_network;
        #[cfg(not(feature = "test-hooks"))]
        false
    }

    /// Whether a test asked for no view.
    pub(super) fn view_refused(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        return self.force_no_view;
        #[cfg(not(feature = "test-hooks"))]
        false
    }

    /// Checks what the config's types cannot say (`tools.shell.isolation`).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        settings::absolute("read_paths", &self.read_paths)?;
        if let Some(a) = self.network.allowlist() {
            a.validate().map_err(|e| e.under("network"))?;
            settings::check(
                self.mode != IsolationMode::None,
                "network",
                "an allowlist needs the run confined (mode \"required\" or \"best_effort\")",
            )?;
        }
        settings::check(
            self.mode != IsolationMode::None || self.network != NetworkPolicy::Loopback,
            "network",
            "\"loopback\" needs the run confined (mode \"required\" or \"best_effort\")",
        )?;
        let l = &self.limits;
        for (field, v) in [
            ("address_space_bytes", l.address_space_bytes),
            ("file_size_bytes", l.file_size_bytes),
            ("cpu_seconds", l.cpu_seconds),
            ("open_files", l.open_files),
            ("max_processes", l.max_processes),
        ] {
            if let Some(n) = v {
                settings::positive(field, n).map_err(|e| e.under("limits"))?;
            }
        }
        if let RunAs::Unprivileged { uid, gid } = self.run_as {
            for (field, id) in [("uid", uid), ("gid", gid)] {
                settings::check(
                    id != 0,
                    field,
                    "must not be 0 (root); use \"host\" to run as root",
                )
                .and_then(|()| {
                    settings::check(id != u32::MAX, field, format!("must be below {}", u32::MAX))
                })
                .map_err(|e| e.under("run_as"))?;
            }
        }
        Ok(())
    }
}

/// `run_as` in the config: `"nobody"`, `"host"` or `{"uid": N, "gid": N}`.
impl<'de> Deserialize<'de> for RunAs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Ids {
            uid: u32,
            gid: u32,
        }
        impl<'de> Deserialize<'de> for Ids {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Wire {
                    uid: u32,
                    gid: u32,
                }
                Wire::deserialize(d).map(|w| Ids {
                    uid: w.uid,
                    gid: w.gid,
                })
            }
        }
        struct Spelling;
        impl<'de> de::Visitor<'de> for Spelling {
            type Value = RunAs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"nobody\", \"host\" or {\"uid\": N, \"gid\": N}")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<RunAs, E> {
                match s {
                    "nobody" => Ok(RunAs::default()),
                    "host" => Ok(RunAs::Host),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<RunAs, A::Error> {
                let ids = Ids::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(RunAs::Unprivileged {
                    uid: ids.uid,
                    gid: ids.gid,
                })
            }
        }
        d.deserialize_any(Spelling)
    }
}
