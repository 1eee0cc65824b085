//! The identity layer of a tool's plan: on a root host, the tool's namespaces and whom its
//! runs execute as (an unprivileged uid, with the working dirs idmapped for it, unless the
//! config keeps root's).

use super::applied::{Identity, ViewMount};
use super::kernel::Kernel;
use super::options::{IsolationMode, IsolationOptions, RunAs};
use super::view::Planned;
use crate::sys::namespaces::{HeldNamespaces, Ids};
use std::path::{Path, PathBuf};

/// What a root host's runs hold: the tool's namespaces, and whom they run as.
pub(super) struct RootHost {
    pub held: Option<HeldNamespaces>,
    pub run_as: Option<Ids>,
    /// Why the run keeps the host's uid, when it was asked not to.
    pub fallback: Option<String>,
    /// The view built in the tool's mount namespace, as recorded; `None`: no view.
    pub view: Option<Vec<ViewMount>>,
    /// Why the tool's namespace holds no view.
    pub view_fallback: Option<String>,
}

impl RootHost {
    /// Nothing held: a host that is not root, or a run not confined.
    fn none() -> RootHost {
        RootHost {
            held: None,
            run_as: None,
            fallback: None,
            view: None,
            view_fallback: None,
        }
    }
}

/// A confined run's identity on this host: a root host's namespaces, holding the run's view
/// (`view`, planned for this identity), and run-as ids; or nothing on any other host. Where
/// the view cannot be built, the working dirs and the temp base are idmapped in place of the
/// host's tree (for an unprivileged `run_as`), else, or when that fails outside `required`,
/// the run keeps the host's uid.
///
/// # Errors
/// In `required` mode, why the working dirs cannot be idmapped.
pub(super) fn plan(
    options: &IsolationOptions,
    kernel: &Kernel,
    working_dirs: &[PathBuf],
    tmp_base: &Path,
    view: impl FnOnce(bool) -> Result<Planned, String>,
) -> Result<RootHost, String> {
    if !(kernel.confine && kernel.root) {
        return Ok(RootHost::none());
    }
    let host = Ids::effective();
    let mut mapped = working_dirs.to_vec();
    mapped.push(tmp_base.to_path_buf());
    let (run, idmap) = match options.run_as {
        RunAs::Unprivileged { uid, gid } => (Ids { uid, gid }, true),
        RunAs::Host => (host, false),
    };
    let view_fallback = match view(idmap).and_then(|v| {
        match HeldNamespaces::create_in_view(&mapped, run, &v.plan, &v.owners) {
            Ok(held) => Ok((held, v.record)),
            Err(e) => Err(e.to_string()),
        }
    }) {
        Ok((held, record)) => {
            return Ok(RootHost {
                held: Some(held),
                run_as: idmap.then_some(run),
                fallback: None,
                view: Some(record),
                view_fallback: None,
            })
        }
        Err(e) => {
            log::warn!("shell tool: runs walk the host's tree (no view): {e}");
            Some(e)
        }
    };
    let mut held = in_place(options, run, host, &mapped, idmap)?;
    held.view_fallback = view_fallback;
    Ok(held)
}

/// A root host's namespaces without a view: the writable paths idmapped in place (for an
/// unprivileged `run_as`), else UTS and IPC namespaces only.
fn in_place(
    options: &IsolationOptions,
    run: Ids,
    host: Ids,
    mapped: &[PathBuf],
    idmap: bool,
) -> Result<RootHost, String> {
    let plain = |fallback: Option<String>| RootHost {
        held: HeldNamespaces::create(&[], host)
            .map_err(|e| log::warn!("shell tool: no UTS/IPC namespaces for runs: {e}"))
            .ok(),
        run_as: None,
        fallback,
        view: None,
        view_fallback: None,
    };
    if !idmap {
        return Ok(plain(None));
    }
    match HeldNamespaces::create(mapped, run) {
        Ok(held) => Ok(RootHost {
            held: Some(held),
            run_as: Some(run),
            fallback: None,
            view: None,
            view_fallback: None,
        }),
        Err(e) if options.mode == IsolationMode::Required => Err(format!(
            "on a root host a run executes as uid {}, which needs its working dirs idmapped (Linux 5.12, and a filesystem that supports idmapped mounts): {e}; set tools.shell.isolation.run_as to \"host\" (root without capabilities, root's files readable), or mode \"best_effort\"",
            run.uid
        )),
        Err(e) => {
            log::warn!("shell tool: runs keep the host's uid: {e}");
            Ok(plain(Some(e.to_string())))
        }
    }
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
