//! The policy the kernel here can enforce for a tool's runs (decided once, when the tool is
//! built), and each run's confinement from it (a Landlock ruleset naming the run's private
//! temp directory, the seccomp filter, limits).

use super::net::{NetworkPolicy, Rules, PROXY_PORT};
use super::options::{IsolationMode, IsolationOptions, RunAs};
use crate::sys::cgroup::{RunCgroup, ToolCgroup};
use crate::sys::landlock::{self, Access, FsRule, OpenedRules, TcpPorts};
use crate::sys::limits::Rlimit;
use crate::sys::namespaces::{HeldNamespaces, Ids};
use crate::sys::seccomp::{self, Filter};
use crate::sys::spawn::{self, Confinement, Containment};
use crate::sys::spawner::{self, Prepare, Spawner};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// System directories a normal program needs to read and execute from.
const SYSTEM_READ: &[&str] = &[
    "/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc",
];
/// Device files a normal program writes to or reads from.
const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"];

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

/// What the kernel here lets the shell enforce, decided when the tool is built.
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
    /// The applied policy, as recorded in `tool.execution_started`.
    pub recorded: Value,
}

/// What a root host's runs hold: the tool's namespaces, and whom they run as.
struct RootHost {
    held: Option<HeldNamespaces>,
    run_as: Option<Ids>,
    /// Why the run keeps the host's uid, when it was asked not to.
    fallback: Option<String>,
}

/// Makes a root host's namespaces: with the working dirs and the temp base idmapped for an
/// unprivileged `run_as`, else (or when that fails outside `required`) without.
fn root_host(
    options: &IsolationOptions,
    working_dirs: &[PathBuf],
    tmp_base: &Path,
) -> Result<RootHost, String> {
    let host = Ids::effective();
    if let RunAs::Unprivileged { uid, gid } = options.run_as {
        let mut mapped = working_dirs.to_vec();
        mapped.push(tmp_base.to_path_buf());
        let run = Ids { uid, gid };
        match HeldNamespaces::create(&mapped, run) {
            Ok(held) => {
                return Ok(RootHost {
                    held: Some(held),
                    run_as: Some(run),
                    fallback: None,
                })
            }
            Err(e) if options.mode == IsolationMode::Required => {
                return Err(format!(
                    "on a root host a run executes as uid {uid}, which needs its working dirs idmapped (Linux 5.12, and a filesystem that supports idmapped mounts): {e}; set tools.shell.isolation.run_as to \"host\" (root without capabilities, root's files readable), or mode \"best_effort\""
                ))
            }
            Err(e) => {
                log::warn!("shell tool: runs keep the host's uid: {e}");
                let held = HeldNamespaces::create(&[], host).ok();
                return Ok(RootHost {
                    held,
                    run_as: None,
                    fallback: Some(e.to_string()),
                });
            }
        }
    }
    Ok(RootHost {
        held: HeldNamespaces::create(&[], host)
            .map_err(|e| log::warn!("shell tool: no UTS/IPC namespaces for runs: {e}"))
            .ok(),
        run_as: None,
        fallback: None,
    })
}

/// The policy the kernel here can enforce for `options`, or (in `required` mode) why it cannot.
/// `tmp_base` is where the runs' private temp directories live (it must exist).
pub(crate) fn plan(
    options: &IsolationOptions,
    working_dirs: &[PathBuf],
    executable_dirs: &[PathBuf],
    tmp_base: &Path,
) -> Result<Policy, String> {
    let kernel_abi = landlock::abi();
    let abi = options
        .pretended_abi()
        .map_or(kernel_abi, |p| p.min(kernel_abi));
    let mode = options.mode;
    let confine = mode != IsolationMode::None;
    if mode == IsolationMode::Required && !seccomp::available() {
        return Err(format!(
            "the syscall floor needs a seccomp filter: correx has one for x86_64 and aarch64 \
             (this is {}), and the kernel must accept it (CONFIG_SECCOMP_FILTER; {}); set \
             mode \"best_effort\"",
            std::env::consts::ARCH,
            if seccomp::SUPPORTED {
                "here it answers ENOSYS"
            } else {
                "not probed"
            }
        ));
    }
    if mode == IsolationMode::Required && abi < landlock::MIN_FS_ABI {
        return Err(format!(
            "the kernel offers Landlock ABI {abi} (0: Landlock missing or disabled), and \
             confining the shell's filesystem needs ABI {} (Linux 6.2, with landlock in the \
             `lsm=` boot list); set tools.shell.isolation.mode to \"best_effort\" to run with \
             what the kernel offers, or \"none\" to opt out",
            landlock::MIN_FS_ABI
        ));
    }
    let containment = if options.subreaper_forced() {
        Containment::Subreaper
    } else {
        spawn::best_containment()
    };
    let orphans_killed = containment != Containment::Subreaper || spawn::subreaper_works();
    let landlock_on = confine && abi >= 1;
    let root = crate::sys::euid() == 0;
    // Network by name keeps a run to its proxy with a network namespace of its own (root
    // makes one, anyone else inside the run's own user namespace), or else by holding every
    // connect of the run in its seccomp filter and making it ourselves. Without either there
    // is no proxy to force traffic through, and a run must not get the whole network instead.
    let network = match &options.network {
        NetworkPolicy::Off => RunNetwork::Off,
        NetworkPolicy::Open => RunNetwork::Open,
        NetworkPolicy::Loopback if !confine => {
            return Err(
                "network \"loopback\" needs the run confined: set tools.shell.isolation.mode \
                 to \"required\" or \"best_effort\", or network to true"
                    .into(),
            )
        }
        // Only a namespace keeps a run off the host's loopback (its databases, its
        // agents): connects held in a filter would still reach them.
        NetworkPolicy::Loopback => {
            let netns = (root || containment == (Containment::PidNamespace { user_ns: true }))
                && spawn::network_namespace_works(containment);
            if netns {
                RunNetwork::Loopback
            } else if mode == IsolationMode::Required {
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
        NetworkPolicy::Allowlist(_) if !confine => {
            return Err(
                "a network allowlist needs the run confined: set tools.shell.isolation.mode to \
                 \"required\" or \"best_effort\", or network to true"
                    .into(),
            )
        }
        NetworkPolicy::Allowlist(a) => {
            let netns = (root || containment == (Containment::PidNamespace { user_ns: true }))
                && !options.mediated_forced()
                && spawn::network_namespace_works(containment);
            if netns {
                RunNetwork::Proxied(Arc::new(Rules::new(a)?), Route::Namespace)
            } else if landlock_on && crate::sys::mediate::available() {
                // Landlock too: without it a run of the host's uid could reach into the host
                // (ptrace, pidfd_getfd) and answer its own held connects; Landlock keeps ptrace
                // within the run.
                RunNetwork::Proxied(Arc::new(Rules::new(a)?), Route::Mediated)
            } else if mode == IsolationMode::Required {
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
    };
    // In a loopback namespace every port is the run's own: nothing to keep it from.
    let tcp = landlock_on
        && !matches!(network, RunNetwork::Open | RunNetwork::Loopback)
        && abi >= landlock::NET_ABI;
    let scopes = landlock_on && abi >= landlock::SCOPE_ABI;
    let nproc_in_userns = containment == (Containment::PidNamespace { user_ns: true });
    let host = if confine && root {
        root_host(options, working_dirs, tmp_base)?
    } else {
        RootHost {
            held: None,
            run_as: None,
            fallback: None,
        }
    };
    // The run's own UTS and IPC namespaces: the tool's (root), or made with its user
    // namespace (an unprivileged host); elsewhere SysV IPC is refused by the filter, and the
    // host's name is safe for want of CAP_SYS_ADMIN.
    let own_uts_ipc = host.held.is_some() || nproc_in_userns;
    let filter = (confine && seccomp::available()).then_some(seccomp::Options {
        floor: true,
        network: matches!(network, RunNetwork::Open | RunNetwork::Loopback),
        deny_ipc: !own_uts_ipc,
        // In its own namespace a run's IP sockets reach only itself; a UNIX socket could
        // still connect to a file the filesystem rules leave in reach (the user's D-Bus, an
        // SSH agent, Docker's), so it gets none but socketpairs.
        inet_only: matches!(network, RunNetwork::Loopback),
        proxied: matches!(network, RunNetwork::Proxied(..)),
        mediated: matches!(network, RunNetwork::Proxied(_, Route::Mediated)),
    });
    // Emptying the bounding set needs CAP_SETPCAP: root has it, and so does a run in a user
    // namespace of its own. Elsewhere the set stays, unusable: no_new_privs means no exec can
    // raise a capability into it.
    let drop_bounding = confine && (root || nproc_in_userns);
    if mode == IsolationMode::Required && containment == Containment::Subreaper && !scopes {
        return Err(format!(
            "no PID namespace can be made here, and without Landlock's signal scope (ABI {}, \
             Linux 6.12; this kernel offers ABI {abi}) a run could kill its supervisor and \
             leave its processes behind; allow unprivileged user namespaces, or set \
             tools.shell.isolation.mode to \"best_effort\"",
            landlock::SCOPE_ABI
        ));
    }
    if mode == IsolationMode::Required && !orphans_killed {
        return Err(
            "no PID namespace can be made here and /proc/thread-self/children (Linux \
                    CONFIG_PROC_CHILDREN) is missing, so processes a run detaches could \
                    outlive it; allow unprivileged user namespaces, or set \
                    tools.shell.isolation.mode to \"best_effort\""
                .into(),
        );
    }
    let mut read: Vec<PathBuf> = SYSTEM_READ.iter().map(PathBuf::from).collect();
    for d in executable_dirs.iter().chain(&options.read_paths) {
        if !read.contains(d) {
            read.push(d.clone());
        }
    }
    let write = working_dirs.to_vec();
    let l = &options.limits;
    let mut rlimits = Vec::new();
    if confine {
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
        if nproc_in_userns {
            add(libc::RLIMIT_NPROC, l.max_processes);
        }
    }
    // Where RLIMIT_NPROC does not bound the run (root, or no user namespace), a cgroup's
    // pids.max does, if we may make one.
    let pids_parent = match l.max_processes {
        Some(_) if confine && !nproc_in_userns => crate::sys::cgroup::pids_parent(),
        _ => None,
    };
    // A root host's runs are cloned from a spawner thread that took the shared part of their
    // confinement once: the tool's namespaces, an empty bounding set, the syscall floor (each
    // costs a run tens of microseconds: cred changes and filter compilation are slow).
    let thread_prepare = || -> Option<Prepare> {
        // A root host that could only make user-and-PID namespaces clones its supervisors with
        // CLONE_NEWUSER, which the floor on the thread would refuse: per-run confinement then.
        if !(confine && root) || nproc_in_userns {
            return None;
        }
        let join = match &host.held {
            Some(h) => h.clone_fds().ok()?,
            None => Vec::new(),
        };
        let floor = Filter::new(seccomp::Options {
            floor: true,
            network: true,
            deny_ipc: !own_uts_ipc,
            inet_only: false,
            proxied: false,
            mediated: false,
        })
        .ok()?
        .map(|f| f.instructions());
        Some(Box::new(move || {
            spawner::confine_thread(&join, floor.as_deref())
        }))
    };
    let mut thread_confined = false;
    // v1: one cgroup per tool with a spawner thread in it (no migration per run).
    let tool_cgroup = match (pids_parent, l.max_processes) {
        (Some(p), Some(limit)) if p.v1 => {
            let with = thread_prepare().map(|prepare| ToolCgroup::new(p.dir, limit, prepare));
            match with {
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
    let own_spawner = match (&tool_cgroup, thread_prepare()) {
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
    let pids_cgroup = pids_parent
        .filter(|p| !p.v1)
        .map(|p| p.dir)
        .zip(l.max_processes);
    let (process_bound, bound_scope) = if !confine || l.max_processes.is_none() {
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
    let nproc_enforced = process_bound != "none";
    let recorded = json!({
        "mode": mode.as_str(),
        "landlock_abi": abi,
        "filesystem": if landlock_on {
            json!({
                "read_exec": read.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
                "devices": DEVICES,
                "read_write": write.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
                "private_tmp": true,
                "truncate_handled": abi >= 3,
            })
        } else { Value::Null },
        "network": match (&network, options.network.allowlist()) {
            (RunNetwork::Proxied(_, route), Some(a)) => json!({
                "mode": "allowlist",
                "allow": a.allow,
                "deny": a.deny,
                "allow_private": a.allow_private,
                "resolve": a.resolve,
                "max_connections": a.max_connections,
                "max_bytes": a.max_bytes,
                "enforced_by": route.name(),
                "proxy": format!("127.0.0.1:{PROXY_PORT}"),
                "seccomp_tcp_only": filter.is_some(),
                // Mediated: the run's own connects never happen (correx makes them).
                "landlock_tcp_connect": match (tcp, route) {
                    (false, _) => Value::Null,
                    (true, Route::Namespace) => json!([PROXY_PORT]),
                    (true, Route::Mediated) => json!([]),
                },
            }),
            (RunNetwork::Loopback, _) => json!({
                "mode": "loopback",
                "enforced_by": "network_namespace",
                "reach": "the loopback of the run's own network namespace",
                "seccomp_inet_only": filter.is_some(),
            }),
            _ => json!({
                "mode": if matches!(network, RunNetwork::Open) || !confine { "open" } else { "off" },
                "allowed": matches!(network, RunNetwork::Open) || !confine,
                "seccomp_af_unix_only": filter.is_some_and(|f| !f.network && !f.proxied),
                "unix_datagram_denied": filter.is_some_and(|f| !f.network),
                "landlock_tcp_denied": tcp,
                "fallback": match &options.network {
                    NetworkPolicy::Allowlist(_) => Some("no network namespace or seccomp user notification for a proxy"),
                    NetworkPolicy::Loopback => Some("no network namespace for loopback"),
                    NetworkPolicy::Off | NetworkPolicy::Open => None,
                },
            }),
        },
        "identity": if confine { json!({
            "uid": host.run_as.map_or(crate::sys::euid(), |i| i.uid),
            "gid": host.run_as.map_or(Ids::effective().gid, |i| i.gid),
            "run_as": match (root, host.run_as) {
                (false, _) => "host_user",
                (true, Some(_)) => "unprivileged",
                (true, None) => "host_root",
            },
            "working_dirs_idmapped": host.run_as.is_some(),
            "fallback": host.fallback,
        }) } else { Value::Null },
        "capabilities": match (confine, drop_bounding) {
            (false, _) => "host",
            (true, true) => "none",
            // Effective, permitted, inheritable and ambient are empty; the bounding set
            // cannot be emptied without CAP_SETPCAP, and no_new_privs keeps it unusable.
            (true, false) => "none_but_bounding_set",
        },
        "no_new_privs": confine,
        "devices": if landlock_on { "mknod_denied" } else { "host" },
        "namespaces": {
            "pid": containment != Containment::Subreaper,
            "user": nproc_in_userns,
            "mount": host.held.is_some(),
            "net": matches!(network, RunNetwork::Proxied(_, Route::Namespace) | RunNetwork::Loopback),
            "uts": confine && own_uts_ipc,
            "ipc": confine && own_uts_ipc,
        },
        "ipc": match (confine, own_uts_ipc, filter.is_some()) {
            (false, _, _) => "host",
            (true, true, _) => "own_namespace",
            (true, false, true) => "seccomp_denied",
            (true, false, false) => "host",
        },
        "syscall_floor": if filter.is_some() { json!(seccomp::floor_names()) } else { Value::Null },
        "scopes": {
            "signal": scopes,
            "abstract_unix_socket": scopes && !matches!(network, RunNetwork::Open),
        },
        "limits": if confine { json!({
            "address_space_bytes": l.address_space_bytes,
            "file_size_bytes": l.file_size_bytes,
            "cpu_seconds": l.cpu_seconds,
            "open_files": l.open_files,
            "max_processes": l.max_processes,
            "max_processes_enforced": nproc_enforced,
            "process_bound": process_bound,
            // "tool": concurrent runs of this tool share the bound (a run alone has all of it).
            "process_bound_scope": bound_scope,
            "core_dumps": false,
        }) } else { Value::Null },
        "containment": containment.name(),
        "orphans_killed": orphans_killed,
        // Whether the run cannot kill its own supervisor (which would orphan the rest): it
        // cannot see it from a PID namespace, nor signal it with Landlock's signal scope.
        "supervisor_protected": containment != Containment::Subreaper || scopes,
    });
    let rules = if landlock_on {
        let rules: Vec<FsRule> = landlock::rules_for(&read, Access::ReadExec)
            .chain(landlock::rules_for(DEVICES, Access::DeviceReadWrite))
            .chain(landlock::rules_for(&write, Access::ReadWrite))
            .collect();
        Some(
            landlock::open_rules(abi, &rules)
                .map_err(|e| format!("opening Landlock rule paths: {e}"))?,
        )
    } else {
        None
    };
    let run_filter = match filter {
        Some(f) => Filter::new(seccomp::Options {
            floor: !thread_confined,
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
        rlimits,
        pids_cgroup,
        tool_cgroup,
        own_spawner,
        thread_confined,
        spare_cgroup: parking_lot::Mutex::new(None),
        containment,
        run_filter,
        held: host.held,
        run_as: host.run_as,
        drop_bounding,
        recorded,
    })
}

impl Policy {
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
        }))
    }
}
