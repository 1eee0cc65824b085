//! The policy the kernel here can enforce for a tool's runs, planned once when the tool is
//! built, one layer at a time (the kernel's offer, network, identity, syscalls, filesystem,
//! limits and containment), and each run's confinement from it.

use super::applied::{
    Applied, AppliedPolicy, Capabilities, Devices, Ipc, Namespaces, Scopes, View,
};
use super::filesystem;
use super::identity;
use super::kernel::Kernel;
use super::limits;
use super::net::PROXY_PORT;
use super::network::{self, Route, RunNetwork};
use super::options::{IsolationMode, IsolationOptions};
use super::view::{Planned, Proc};
use crate::sys::cgroup::{RunCgroup, ToolCgroup};
use crate::sys::landlock::{self, OpenedRules, TcpPorts};
use crate::sys::limits::Rlimit;
use crate::sys::namespaces::{HeldNamespaces, Ids};
use crate::sys::seccomp::{self, Filter};
use crate::sys::spawn::{Confinement, Containment};
use crate::sys::spawner::Spawner;
use crate::sys::view::ViewPlan;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What the kernel here lets a tool enforce, decided when the tool is built.
#[derive(Debug)]
pub(crate) struct Policy {
    mode: IsolationMode,
    pub network: RunNetwork,
    /// The static rules (system, executables, read paths, devices, working dirs), opened once.
    rules: Option<OpenedRules>,
    rlimits: Vec<Rlimit>,
    /// Where each run's `pids` cgroup goes, and its limit.
    pids_cgroup: Option<(&'static Path, u64)>,
    /// The tool's cgroup and spawner thread (cgroup v1).
    tool_cgroup: Option<ToolCgroup>,
    /// A spawner thread of the tool's own (a root host without a v1 cgroup).
    own_spawner: Option<Spawner>,
    /// The spawner thread holds the tool's namespaces, an empty bounding set and the floor.
    thread_confined: bool,
    /// An empty cgroup a finished run left, for the next.
    spare_cgroup: parking_lot::Mutex<Option<RunCgroup>>,
    pub containment: Containment,
    /// Each run's own filter, assembled once (what the spawner thread does not hold).
    run_filter: Option<Filter>,
    /// The tool's namespaces (root hosts), with the run's idmapped views of its directories.
    pub held: Option<HeldNamespaces>,
    /// The ids a run executes as (root hosts), when not the host's.
    run_as: Option<Ids>,
    drop_bounding: bool,
    /// Each run's view, built by its supervisor (an unprivileged host).
    run_view: Option<Arc<ViewPlan>>,
    /// Each run mounts a /proc of its own over the tool's view (a root host), in a mount
    /// namespace of this pool's.
    proc_pool: Option<Arc<crate::sys::view::ProcPool>>,
    /// The Landlock rights a run's own /proc gets (0 without Landlock).
    proc_rights: u64,
    /// The Landlock rights a staged working dir's overlay gets (0 without Landlock).
    pub stage_rights: u64,
    /// The applied policy, as recorded in `tool.execution_started`.
    pub applied: AppliedPolicy,
}

/// The policy the kernel here can enforce for `options`, or (in `required` mode) why it cannot.
/// `tmp_base` is where the runs' private temp directories live (it must exist).
pub(crate) fn plan(
    options: &IsolationOptions,
    working_dirs: &[PathBuf],
    executable_dirs: &[PathBuf],
    tmp_base: &Path,
    staging: Option<&Path>,
) -> Result<Policy, String> {
    let mode = options.mode;
    let kernel = Kernel::probe(options);
    kernel.check_floor(mode)?;
    let confine = kernel.confine;
    let network = network::plan(options, &kernel)?;
    let grants = filesystem::grants(options, working_dirs, executable_dirs);
    // A root host's view is built once, in the tool's mount namespace; each run with a PID
    // namespace mounts its own /proc over it.
    let root_proc = if kernel.containment == (Containment::PidNamespace { user_ns: false }) {
        Proc::PerRun
    } else {
        Proc::None
    };
    let refused = || "no view: turned off by a test hook".to_owned();
    let host = identity::plan(options, &kernel, working_dirs, tmp_base, |idmap| {
        if options.view_refused() {
            return Err(refused());
        }
        grants.view(idmap, root_proc, tmp_base, staging)
    })?;
    let run_view = if options.view_refused() {
        Err(refused())
    } else {
        run_view(&kernel, &grants, tmp_base)
    };
    // The run's own UTS and IPC namespaces: the tool's (root), or made with its user
    // namespace (an unprivileged host); elsewhere SysV IPC is refused by the filter, and the
    // host's name is safe for want of CAP_SYS_ADMIN.
    let own_uts_ipc = host.held.is_some() || kernel.own_user_namespace();
    let filter = (confine && seccomp::available()).then_some(seccomp::Options {
        floor: true,
        split_mount: false,
        deny_ipc: !own_uts_ipc,
        sockets: network.sockets(),
    });
    // Emptying the bounding set needs CAP_SETPCAP: root has it, and so does a run in a user
    // namespace of its own. Elsewhere the set stays, unusable: no_new_privs means no exec can
    // raise a capability into it.
    let drop_bounding = confine && (kernel.root || kernel.own_user_namespace());
    kernel.check_containment(mode)?;
    // Mounting each run's /proc is the supervisor's: the floor on the spawner thread leaves
    // `mount` to each run's own filter then.
    let per_run_proc = host.view.is_some() && root_proc == Proc::PerRun;
    let processes = limits::plan(
        options,
        &kernel,
        host.held.as_ref(),
        own_uts_ipc,
        per_run_proc,
    );
    let own_proc = per_run_proc && processes.thread_confined;
    let view = view_record(&host, &run_view, own_proc);
    let applied = applied(&Layers {
        options,
        kernel: &kernel,
        network: &network,
        host: &host,
        grants: &grants,
        processes: &processes,
        filtered: filter.is_some(),
        own_uts_ipc,
        drop_bounding,
        view,
    });
    let rules = grants.open(&kernel)?;
    let thread_confined = processes.thread_confined;
    let run_filter = match filter {
        Some(f) => Filter::new(seccomp::Options {
            floor: !thread_confined,
            split_mount: thread_confined && per_run_proc,
            // The spawner thread's filter refuses SysV IPC where that is needed.
            deny_ipc: f.deny_ipc && !thread_confined,
            ..f
        })?,
        None => None,
    };
    Ok(Policy {
        mode,
        network,
        rules,
        rlimits: processes.rlimits,
        pids_cgroup: processes.pids_cgroup,
        tool_cgroup: processes.tool_cgroup,
        own_spawner: processes.own_spawner,
        thread_confined,
        spare_cgroup: parking_lot::Mutex::new(None),
        containment: kernel.containment,
        run_filter,
        held: host.held,
        run_as: host.run_as,
        drop_bounding,
        run_view: run_view.ok().map(|v| Arc::new(v.plan)),
        proc_pool: own_proc.then(Arc::default),
        proc_rights: if kernel.landlock_on() {
            landlock::read_rights(kernel.abi)
        } else {
            0
        },
        stage_rights: if kernel.landlock_on() {
            landlock::write_rights(kernel.abi)
        } else {
            0
        },
        applied,
    })
}

/// A view per run, where runs get a user namespace of their own (an unprivileged host): built
/// by each run's supervisor, with its /proc where the kernel lets a user namespace mount one.
fn run_view(
    kernel: &Kernel,
    grants: &filesystem::Grants,
    tmp_base: &Path,
) -> Result<Planned, String> {
    if !kernel.confine {
        return Err("the run is not confined".into());
    }
    if kernel.root {
        return Err("a root host's view is its tool's".into());
    }
    if !kernel.own_user_namespace() {
        return Err(
            "no mount namespace can be made here (no unprivileged user namespaces): the run \
             walks the host's tree, filtered by Landlock"
                .into(),
        );
    }
    let proc = if crate::sys::view::proc_in_user_namespace() {
        Proc::AtBuild
    } else {
        Proc::None
    };
    grants.view(false, proc, tmp_base, None)
}

/// The view as recorded: the tool's (root host), each run's, or none and why.
fn view_record(
    host: &identity::RootHost,
    run_view: &Result<Planned, String>,
    own_proc: bool,
) -> View {
    if let Some(mounts) = &host.view {
        return View {
            built: "tool",
            mounts: mounts.clone(),
            proc: if own_proc { "own" } else { "none" },
            fallback: (!own_proc).then(|| {
                "no /proc: the run has no PID namespace, or its spawner thread could not be \
                 prepared"
                    .to_owned()
            }),
        };
    }
    match run_view {
        Ok(v) => View {
            built: "run",
            mounts: v.record.clone(),
            proc: if v.plan.proc_at_build { "own" } else { "none" },
            fallback: (!v.plan.proc_at_build).then(|| {
                "no /proc: the kernel refuses a procfs in the run's user namespace (the host's \
                 /proc is partly covered, as in many containers)"
                    .to_owned()
            }),
        },
        Err(e) => View {
            built: "none",
            mounts: Vec::new(),
            proc: "none",
            fallback: Some(host.view_fallback.clone().unwrap_or_else(|| e.clone())),
        },
    }
}

/// Every layer as planned, for the record.
struct Layers<'a> {
    options: &'a IsolationOptions,
    kernel: &'a Kernel,
    network: &'a RunNetwork,
    host: &'a identity::RootHost,
    grants: &'a filesystem::Grants,
    processes: &'a limits::Processes,
    /// The run has a seccomp filter.
    filtered: bool,
    own_uts_ipc: bool,
    drop_bounding: bool,
    view: View,
}

/// The policy as applied, layer by layer, as `tool.execution_started` records it.
fn applied(layers: &Layers<'_>) -> AppliedPolicy {
    let Layers {
        options,
        kernel,
        network,
        host,
        grants,
        processes,
        filtered,
        own_uts_ipc,
        drop_bounding,
        view,
    } = layers;
    let (filtered, own_uts_ipc, drop_bounding) = (*filtered, *own_uts_ipc, *drop_bounding);
    let confine = kernel.confine;
    let mode = options.mode;
    let scopes = kernel.scopes();
    AppliedPolicy::Applied(Box::new(Applied {
        mode,
        landlock_abi: kernel.abi,
        filesystem: grants.applied(kernel),
        view: view.clone(),
        network: network::applied(options, network, kernel, filtered),
        identity: identity::applied(host, kernel),
        capabilities: match (confine, drop_bounding) {
            (false, _) => Capabilities::Host,
            (true, true) => Capabilities::None,
            (true, false) => Capabilities::NoneButBoundingSet,
        },
        no_new_privs: confine,
        devices: if kernel.landlock_on() {
            Devices::MknodDenied
        } else {
            Devices::Host
        },
        namespaces: Namespaces {
            pid: kernel.containment != Containment::Subreaper,
            user: kernel.own_user_namespace(),
            mount: host.held.is_some() || view.built == "run",
            net: network.own_namespace(),
            uts: confine && own_uts_ipc,
            ipc: confine && own_uts_ipc,
        },
        ipc: match (confine, own_uts_ipc, filtered) {
            (false, _, _) => Ipc::Host,
            (true, true, _) => Ipc::OwnNamespace,
            (true, false, true) => Ipc::SeccompDenied,
            (true, false, false) => Ipc::Host,
        },
        syscall_floor: filtered.then(seccomp::floor_names),
        scopes: Scopes {
            signal: scopes,
            abstract_unix_socket: scopes && !matches!(network, RunNetwork::Open),
        },
        limits: processes.applied(options, kernel),
        containment: kernel.containment.name(),
        orphans_killed: kernel.orphans_killed,
        supervisor_protected: kernel.containment != Containment::Subreaper || scopes,
    }))
}

impl Policy {
    /// Whether each run starts in its directory by path: it builds its own view, or enters a
    /// mount namespace of its own over the tool's (a descriptor of the host's tree, or of the
    /// tool's namespace, would be outside its root).
    pub fn start_by_path(&self) -> bool {
        self.run_view.is_some() || self.proc_pool.is_some()
    }

    /// The ids a run executes as, where not the host's (a root host).
    pub fn run_ids(&self) -> Option<(u32, u32)> {
        self.run_as.map(|i| (i.uid, i.gid))
    }

    /// Whether a run's working dirs can be staged (overlays mounted in the run's own mount
    /// namespace, by its supervisor): `Ok(true)` where that namespace is owned by the run's
    /// user namespace (an unprivileged host: the overlay keeps its marks in `user.*`
    /// attributes), `Ok(false)` on a root host; else why not.
    pub fn staging(&self) -> Result<bool, String> {
        if self.run_view.is_some() {
            Ok(true)
        } else if self.proc_pool.is_some() {
            Ok(false)
        } else {
            Err(format!(
                "staging needs a view built for each run or a mount namespace of each run's \
                 own, and there is none here: {}",
                match &self.applied {
                    AppliedPolicy::Applied(a) => a
                        .view
                        .fallback
                        .clone()
                        .unwrap_or_else(|| "the run has no PID namespace".into()),
                    AppliedPolicy::Refused { refused, .. } => refused.clone(),
                }
            ))
        }
    }

    /// A fresh `pids` cgroup for one run, where that is how its processes are bounded.
    pub fn run_cgroup(&self) -> Result<Option<RunCgroup>, String> {
        let Some((parent, limit)) = self.pids_cgroup else {
            return Ok(None);
        };
        if let Some(cg) = self.spare_cgroup.lock().take() {
            if cg.is_empty() {
                return Ok(Some(cg));
            }
        }
        RunCgroup::new(parent, limit).map(Some).map_err(|e| {
            format!(
                "creating the run's pids cgroup in {}: {e}",
                parent.display()
            )
        })
    }

    /// The thread to clone a run's supervisor from, when the tool has one (a v1 cgroup of its
    /// own, or a root host).
    pub fn spawner(&self) -> Option<&Spawner> {
        self.tool_cgroup
            .as_ref()
            .map(ToolCgroup::spawner)
            .or(self.own_spawner.as_ref())
    }

    /// After a run: keeps its cgroup for the next run when no process is left in it.
    pub fn recycle_cgroup(&self, cg: RunCgroup) {
        if cg.is_empty() {
            let mut spare = self.spare_cgroup.lock();
            if spare.is_none() {
                *spare = Some(cg);
            }
        }
    }

    /// The confinement for one run whose private temp directory is `tmp`; `None` in mode
    /// `none`.
    pub fn confinement(&self, tmp: &Path) -> Result<Option<Confinement>, String> {
        if self.mode == IsolationMode::None {
            return Ok(None);
        }
        let ruleset = match &self.rules {
            Some(rules) => Some(
                match &self.network {
                    RunNetwork::Off => landlock::build(rules, tmp, true),
                    RunNetwork::Open | RunNetwork::Loopback => landlock::build(rules, tmp, false),
                    // The proxy's port alone, to connect to; nothing to bind. Mediated, not
                    // even that: correx makes the run's connects.
                    RunNetwork::Proxied(_, route) => landlock::build_with(
                        rules,
                        Some(tmp),
                        Some(&TcpPorts {
                            bind: Vec::new(),
                            connect: match route {
                                Route::Namespace => vec![PROXY_PORT],
                                Route::Mediated => Vec::new(),
                            },
                        }),
                        true,
                    ),
                }
                .map_err(|e| format!("building the Landlock ruleset: {e}"))?,
            ),
            None => None,
        };
        Ok(Some(Confinement {
            ruleset,
            filter: self.run_filter.clone(),
            rlimits: self.rlimits.clone(),
            join: match (&self.held, self.thread_confined) {
                (Some(held), false) => held.fds(),
                _ => [-1; 3],
            },
            drop_bounding: self.drop_bounding && !self.thread_confined,
            run_as: self.run_as.map(|i| (i.uid, i.gid)),
            view: self.run_view.clone(),
            proc_pool: self.proc_pool.clone(),
            proc_rights: self.proc_rights,
            overlays: Vec::new(),
        }))
    }
}
