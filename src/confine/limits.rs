//! The limits and containment layer of a tool's plan: each run's rlimits, how its processes
//! are bounded (`RLIMIT_NPROC` in its own user namespace, else a `pids` cgroup), and the
//! spawner thread a root host clones its runs from.

use super::applied::Limits;
use super::kernel::Kernel;
use super::options::IsolationOptions;
use crate::sys::cgroup::ToolCgroup;
use crate::sys::limits::Rlimit;
use crate::sys::namespaces::HeldNamespaces;
use crate::sys::seccomp::{self, Filter, Sockets};
use crate::sys::spawner::{self, Prepare, Spawner};
use std::path::Path;

/// How a tool's runs are limited and where they are cloned from.
pub(super) struct Processes {
    /// Each run's rlimits.
    pub rlimits: Vec<Rlimit>,
    /// Where each run's `pids` cgroup goes, and its limit.
    pub pids_cgroup: Option<(&'static Path, u64)>,
    /// The tool's cgroup and spawner thread (cgroup v1).
    pub tool_cgroup: Option<ToolCgroup>,
    /// A spawner thread of the tool's own (a root host without a v1 cgroup).
    pub own_spawner: Option<Spawner>,
    /// The spawner thread holds the tool's namespaces, an empty bounding set and the floor.
    pub thread_confined: bool,
    /// How the process count is bounded, as recorded.
    process_bound: &'static str,
    /// Whether the bound is each run's or shared by the tool's runs.
    bound_scope: &'static str,
}

/// The rlimits of a confined run (none in mode `none`); core dumps are always off.
fn rlimits(options: &IsolationOptions, kernel: &Kernel) -> Vec<Rlimit> {
    let l = &options.limits;
    let mut rlimits = Vec::new();
    if !kernel.confine {
        return rlimits;
    }
    rlimits.push(Rlimit::at_most(libc::RLIMIT_CORE, 0));
    let mut add = |r, v: Option<u64>| {
        if let Some(v) = v {
            rlimits.push(Rlimit::at_most(r, v));
        }
    };
    add(libc::RLIMIT_AS, l.address_space_bytes);
    add(libc::RLIMIT_FSIZE, l.file_size_bytes);
    add(libc::RLIMIT_CPU, l.cpu_seconds);
    add(libc::RLIMIT_NOFILE, l.open_files);
    // Counted per user and user namespace: only inside our own user namespace does it
    // bound this run rather than every process the user has.
    if kernel.own_user_namespace() {
        add(libc::RLIMIT_NPROC, l.max_processes);
    }
    rlimits
}

/// What a root host's spawner thread takes once for every run: the tool's namespaces, an
/// empty bounding set, the syscall floor (each costs a run tens of microseconds: cred changes
/// and filter compilation are slow); with `mount_per_run`, the floor but `mount`, which each
/// run's supervisor needs for its /proc and each run's own filter refuses. `None` where runs
/// confine themselves.
fn thread_prepare(
    kernel: &Kernel,
    held: Option<&HeldNamespaces>,
    own_uts_ipc: bool,
    mount_per_run: bool,
) -> Option<Prepare> {
    // A root host that could only make user-and-PID namespaces clones its supervisors with
    // CLONE_NEWUSER, which the floor on the thread would refuse: per-run confinement then.
    if !(kernel.confine && kernel.root) || kernel.own_user_namespace() {
        return None;
    }
    let join = match held {
        Some(h) => h.clone_fds().ok()?,
        None => Vec::new(),
    };
    let floor = Filter::new(seccomp::Options {
        floor: true,
        split_mount: mount_per_run,
        deny_ipc: !own_uts_ipc,
        sockets: Sockets::Any,
    })
    .ok()?
    .map(|f| f.instructions());
    Some(Box::new(move || {
        spawner::confine_thread(&join, floor.as_deref())
    }))
}

/// The process bounds and spawner of a tool's runs.
pub(super) fn plan(
    options: &IsolationOptions,
    kernel: &Kernel,
    held: Option<&HeldNamespaces>,
    own_uts_ipc: bool,
    mount_per_run: bool,
) -> Processes {
    let max = options.limits.max_processes;
    let nproc_in_userns = kernel.own_user_namespace();
    // Where RLIMIT_NPROC does not bound the run (root, or no user namespace), a cgroup's
    // pids.max does, if we may make one.
    let pids_parent = match max {
        Some(_) if kernel.confine && !nproc_in_userns => crate::sys::cgroup::pids_parent(),
        _ => None,
    };
    let prepare = || thread_prepare(kernel, held, own_uts_ipc, mount_per_run);
    let mut thread_confined = false;
    // v1: one cgroup per tool with a spawner thread in it (no migration per run).
    let tool_cgroup = match (pids_parent, max) {
        (Some(p), Some(limit)) if p.v1 => {
            match prepare().map(|prepare| ToolCgroup::new(p.dir, limit, prepare)) {
                Some(Ok(cg)) => {
                    thread_confined = true;
                    Some(cg)
                }
                other => {
                    if let Some(Err(e)) = other {
                        log::warn!("shell tool: confining the spawner thread: {e}");
                    }
                    match ToolCgroup::new(p.dir, limit, Box::new(|| Ok(()))) {
                        Ok(cg) => Some(cg),
                        Err(e) => {
                            log::warn!("shell tool: no pids cgroup in {}: {e}", p.dir.display());
                            None
                        }
                    }
                }
            }
        }
        _ => None,
    };
    let own_spawner = match (&tool_cgroup, prepare()) {
        (None, Some(prepare)) => match Spawner::start(prepare) {
            Ok(s) => {
                thread_confined = true;
                Some(s)
            }
            Err(e) => {
                log::warn!("shell tool: confining the spawner thread: {e}");
                None
            }
        },
        _ => None,
    };
    let pids_cgroup = pids_parent.filter(|p| !p.v1).map(|p| p.dir).zip(max);
    let (process_bound, bound_scope) = if !kernel.confine || max.is_none() {
        ("none", "none")
    } else if nproc_in_userns {
        ("rlimit_nproc_in_user_namespace", "run")
    } else if tool_cgroup.is_some() {
        ("cgroup_pids_max", "tool")
    } else if pids_cgroup.is_some() {
        ("cgroup_pids_max", "run")
    } else {
        ("none", "none")
    };
    Processes {
        rlimits: rlimits(options, kernel),
        pids_cgroup,
        tool_cgroup,
        own_spawner,
        thread_confined,
        process_bound,
        bound_scope,
    }
}

impl Processes {
    /// The limits as applied, for the record; `None` for a run not confined.
    pub fn applied(&self, options: &IsolationOptions, kernel: &Kernel) -> Option<Limits> {
        kernel.confine.then(|| Limits {
            configured: options.limits.clone(),
            max_processes_enforced: self.process_bound != "none",
            process_bound: self.process_bound,
            process_bound_scope: self.bound_scope,
            core_dumps: false,
        })
    }
}
