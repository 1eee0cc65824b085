//! The identity layer of a tool's plan: on a root host, the tool's namespaces and whom its
//! runs execute as (an unprivileged uid, with the working dirs idmapped for it, unless the
//! config keeps root's).

use super::applied::Identity;
use super::kernel::Kernel;
use super::options::{IsolationMode, IsolationOptions, RunAs};
use crate::sys::namespaces::{HeldNamespaces, Ids};
use std::path::{Path, PathBuf};

/// What a root host's runs hold: the tool's namespaces, and whom they run as.
pub(super) struct RootHost {
    pub held: Option<HeldNamespaces>,
    pub run_as: Option<Ids>,
    /// Why the run keeps the host's uid, when it was asked not to.
    pub fallback: Option<String>,
}

impl RootHost {
    /// Nothing held: a host that is not root, or a run not confined.
    fn none() -> RootHost {
        RootHost {
            held: None,
            run_as: None,
            fallback: None,
        }
    }
}

/// A confined run's identity on this host: a root host's namespaces and run-as ids (with the
/// working dirs and the temp base idmapped for an unprivileged `run_as`, else, or when that
/// fails outside `required`, without), or nothing on any other host.
///
/// # Errors
/// In `required` mode, why the working dirs cannot be idmapped.
pub(super) fn plan(
    options: &IsolationOptions,
    kernel: &Kernel,
    working_dirs: &[PathBuf],
    tmp_base: &Path,
) -> Result<RootHost, String> {
    if !(kernel.confine && kernel.root) {
        return Ok(RootHost::none());
    }
    let host = Ids::effective();
    if let RunAs::Unprivileged { uid, gid } = options.run_as {
        let mut mapped = working_dirs.to_vec();
        mapped.push(tmp_base.to_path_buf());
        let run = Ids { uid, gid };
        return match HeldNamespaces::create(&mapped, run) {
            Ok(held) => Ok(RootHost {
                held: Some(held),
                run_as: Some(run),
                fallback: None,
            }),
            Err(e) if options.mode == IsolationMode::Required => Err(format!(
                "on a root host a run executes as uid {uid}, which needs its working dirs idmapped (Linux 5.12, and a filesystem that supports idmapped mounts): {e}; set tools.shell.isolation.run_as to \"host\" (root without capabilities, root's files readable), or mode \"best_effort\""
            )),
            Err(e) => {
                log::warn!("shell tool: runs keep the host's uid: {e}");
                Ok(RootHost {
                    held: HeldNamespaces::create(&[], host).ok(),
                    run_as: None,
                    fallback: Some(e.to_string()),
                })
            }
        };
    }
    Ok(RootHost {
        held: HeldNamespaces::create(&[], host)
            .map_err(|e| log::warn!("shell tool: no UTS/IPC namespaces for runs: {e}"))
            .ok(),
        run_as: None,
        fallback: None,
    })
}

/// The identity as applied, for the record; `None` for a run not confined.
pub(super) fn applied(host: &RootHost, kernel: &Kernel) -> Option<Identity> {
    kernel.confine.then(|| Identity {
        uid: host.run_as.map_or(crate::sys::euid(), |i| i.uid),
        gid: host.run_as.map_or(Ids::effective().gid, |i| i.gid),
        run_as: match (kernel.root, host.run_as) {
            (false, _) => "host_user",
            (true, Some(_)) => "unprivileged",
            (true, None) => "host_root",
        },
        working_dirs_idmapped: host.run_as.is_some(),
        fallback: host.fallback.clone(),
    })
}
