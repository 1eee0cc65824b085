//! How a spawned llama-server is confined (config `models.isolation`): it parses untrusted
//! prompts and files and can serve static files, so a compromised or misconfigured server must
//! hold as little as a shell run.
//!
//! - **Filesystem** (Landlock): read and execute the binary's directory and the system library
//!   directories (`/usr`, `/lib`, `/lib64`); read the model file, `/etc/ld.so.cache`, CPU
//!   topology (`/sys/devices/system/cpu`, `/proc/cpuinfo`) and every file an extra argument
//!   names (a chat template, a projector, a LoRA); `/dev/null` and `/dev/urandom`. Nothing
//!   is writable (its output goes through pipes to the log). A directory named by an argument
//!   (`--path`) is not granted: static files are served from nowhere.
//! - **Network** (Landlock ABI 4): TCP bind on its own port only; TCP connect nowhere, or to
//!   the ports of its `--rpc` helpers. Landlock scopes signals and abstract UNIX sockets.
//! - The seccomp **syscall floor** of the shell, SysV IPC refused; **no capability** in any
//!   set and `no_new_privs`; no core dumps and an address-space limit from the model's size.
//!
//! The server keeps the host's uid (root's files are kept from it by Landlock, not by a uid).

use super::applied::{Confined, Families, Files, Limits, Network, ServerPolicy};
use crate::confine::applied::{Scopes, View};
use crate::sys::landlock::{self, Access, FsRule, TcpPorts};
use crate::sys::limits::Rlimit;
use crate::sys::seccomp::Sockets;
use crate::sys::seccomp::{self, Filter};
use crate::sys::{ForkConfinement, ForkView};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// How strictly spawned servers are confined (config `models.isolation`: `required`,
/// `best_effort` or `none`; left out, the default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerIsolation {
    /// `required` where the kernel offers every layer (Landlock ABI 6 and the seccomp filter),
    /// else `best_effort` with a warning. The default.
    #[default]
    #[serde(skip)]
    Default,
    /// Every layer or no load: a kernel without one fails the load naming it.
    Required,
    /// What the kernel offers, recorded.
    BestEffort,
    /// Fenced only (cleared environment, no inherited descriptors, its own process group).
    None,
}

impl ServerIsolation {
    /// The config spelling (`default` for [`ServerIsolation::Default`]).
    pub fn as_str(self) -> &'static str {
        match self {
            ServerIsolation::Default => "default",
            ServerIsolation::Required => "required",
            ServerIsolation::BestEffort => "best_effort",
            ServerIsolation::None => "none",
        }
    }
}

/// Address space beyond twice the model's estimate: thread stacks and allocator arenas reserve
/// far more than they touch.
const ADDRESS_SPACE_MARGIN: u64 = 8 << 30;

/// The confinement of one server and the policy to record, or why `required` cannot be met.
pub(super) fn plan(
    mode: ServerIsolation,
    bin: &Path,
    model: &Path,
    port: u16,
    extra_args: &[String],
    estimate: Option<u64>,
    slot_dir: Option<&Path>,
) -> Result<(Option<ForkConfinement>, Value), String> {
    if mode == ServerIsolation::None {
        return Ok((None, ServerPolicy::Fenced { mode: "none" }.to_json()));
    }
    let abi = landlock::abi();
    let mode = mode_here(mode, abi)?;
    let grants = grants(bin, model, extra_args, slot_dir);
    let ruleset = if abi >= 1 {
        // The files get read (and execute, which no file here is for) only.
        let rules: Vec<FsRule> = landlock::rules_for(
            grants.read_exec.iter().chain(&grants.read),
            Access::ReadExec,
        )
        .chain(landlock::rules_for(
            &grants.devices,
            Access::DeviceReadWrite,
        ))
        .chain(landlock::rules_for(&grants.read_write, Access::ReadWrite))
        .collect();
        let opened = landlock::open_rules(abi, &rules)
            .map_err(|e| format!("opening the server's Landlock rule paths: {e}"))?;
        let tcp = TcpPorts {
            bind: vec![port],
            connect: grants.connect.clone(),
        };
        Some(
            landlock::build_with(&opened, None, Some(&tcp), true)
                .map_err(|e| format!("building the server's Landlock ruleset: {e}"))?,
        )
    } else {
        None
    };
    // Sockets: TCP/IP and netlink (getaddrinfo's address check) only. A UNIX socket would reach
    // daemons that trust the server's uid (a Docker socket, the system bus), and Landlock does
    // not cover connecting to one.
    let filter = if seccomp::available() {
        Filter::new(seccomp::Options {
            floor: true,
            split_mount: false,
            sockets: Sockets::InetOnly,
            deny_ipc: true,
        })?
    } else {
        None
    };
    let size = estimate
        .or_else(|| std::fs::metadata(model).ok().map(|m| m.len()))
        .unwrap_or(0);
    let address_space = size.saturating_mul(2).saturating_add(ADDRESS_SPACE_MARGIN);
    let mut rlimits = vec![Rlimit::at_most(libc::RLIMIT_CORE, 0)];
    if !grants.gpu {
        rlimits.push(Rlimit::at_most(libc::RLIMIT_AS, address_space));
    }
    let (view, view_record) = match server_view(&grants) {
        Ok((v, mounts)) => (
            Some(v),
            View {
                built: "server",
                mounts,
                proc: "none",
                fallback: None,
            },
        ),
        Err(why) => {
            log::warn!("llama-server sees the host's tree, filtered by Landlock: {why}");
            (
                None,
                View {
                    built: "none",
                    mounts: Vec::new(),
                    proc: "none",
                    fallback: Some(why),
                },
            )
        }
    };
    let applied = Applied {
        mode,
        abi,
        landlock: ruleset.is_some(),
        filtered: filter.is_some(),
        port,
        address_space,
    };
    let recorded = applied.recorded(&grants, view_record).to_json();
    Ok((
        Some(ForkConfinement {
            ruleset,
            filter,
            rlimits,
            drop_bounding: crate::sys::euid() == 0,
            view,
        }),
        recorded,
    ))
}

/// The server's view: its binary's directory, the system libraries, and the files it reads
/// (the model, the CPU topology), each at its own path; writable only its prompt cache
/// directory, when it has one. Built in a mount
/// namespace of the server's own (inside a user namespace of its own on a host that is not
/// root).
///
/// # Errors
/// Why no view can be made here (no mount namespace, a grant it cannot hold).
fn server_view(g: &Grants) -> Result<(ForkView, Vec<crate::confine::applied::ViewMount>), String> {
    use std::os::unix::ffi::OsStrExt;
    let root = crate::sys::euid() == 0;
    if !root
        && crate::sys::spawn::best_containment()
            != (crate::sys::spawn::Containment::PidNamespace { user_ns: true })
    {
        return Err("no mount namespace can be made here (no unprivileged user namespaces)".into());
    }
    let (devices, read): (Vec<PathBuf>, Vec<PathBuf>) =
        g.read.iter().cloned().partition(|p| p.starts_with("/dev"));
    let devices: Vec<PathBuf> = devices
        .into_iter()
        .chain(g.devices.iter().cloned())
        .collect();
    let stage =
        std::fs::canonicalize(std::env::temp_dir()).map_err(|e| format!("the temp dir: {e}"))?;
    let system: Vec<&str> = g
        .read_exec
        .iter()
        .filter_map(|p| p.to_str())
        .filter(|p| SYSTEM.contains(p))
        .collect();
    let extra: Vec<PathBuf> = g
        .read_exec
        .iter()
        .filter(|p| !p.to_str().is_some_and(|p| SYSTEM.contains(&p)))
        .cloned()
        .chain(read)
        .collect();
    let planned = crate::confine::view::plan(&crate::confine::view::Spec {
        system: &system,
        read: &extra,
        write: &g.read_write,
        devices: &devices,
        idmap: false,
        unmapped: None,
        proc: crate::confine::view::Proc::None,
        stage: &stage,
    })?;
    let maps = if root {
        None
    } else {
        Some(crate::sys::spawn::id_maps().map_err(|e| e.to_string())?)
    };
    let cwd = std::env::current_dir()
        .ok()
        .and_then(|d| std::ffi::CString::new(d.as_os_str().as_bytes()).ok());
    Ok((
        ForkView {
            plan: planned.plan,
            maps,
            cwd,
        },
        planned.record,
    ))
}

/// The system directories a server reads its libraries from (kept as symlinks where they are
/// on the host).
const SYSTEM: &[&str] = &["/usr", "/lib", "/lib64"];

/// What `mode` means on this kernel: `default` is `required` where every layer is offered,
/// else `best_effort` with a warning.
///
/// # Errors
/// `required` where a layer is missing, naming it.
fn mode_here(mode: ServerIsolation, abi: u32) -> Result<ServerIsolation, String> {
    // ABI 6 scopes signals: the server keeps the host's uid, and without the scope it could
    // signal every process of that uid.
    let complete = abi >= landlock::SCOPE_ABI && seccomp::available();
    let mode = match mode {
        ServerIsolation::Default if complete => ServerIsolation::Required,
        ServerIsolation::Default => {
            log::warn!(
                "llama-server runs less confined: the kernel offers Landlock ABI {abi} (TCP rules \
                 need 4, signal scoping 6, Linux 6.12){}",
                if seccomp::available() {
                    ""
                } else {
                    " and no seccomp filter can be installed here"
                }
            );
            ServerIsolation::BestEffort
        }
        other => other,
    };
    if mode == ServerIsolation::Required && !complete {
        return Err(format!(
            "models.isolation is \"required\", and confining llama-server needs Landlock ABI {} \
             (Linux 6.12, for its TCP rules and signal scope; this kernel offers {abi}) and a \
             seccomp filter (x86_64, aarch64, accepted by the kernel; this is {}); set \
             models.isolation to \"best_effort\" or \"none\"",
            landlock::SCOPE_ABI,
            std::env::consts::ARCH
        ));
    }
    Ok(mode)
}

/// What a server may reach: directories to read and execute, files to read, devices, the
/// ports of its RPC helpers, and whether it offloads to a GPU.
struct Grants {
    read_exec: Vec<PathBuf>,
    read: Vec<PathBuf>,
    /// Its prompt cache directory.
    read_write: Vec<PathBuf>,
    devices: Vec<PathBuf>,
    connect: Vec<u16>,
    gpu: bool,
}

/// The grants of the server `bin` serving `model` with `extra_args`, saving slots in
/// `slot_dir`.
fn grants(bin: &Path, model: &Path, extra_args: &[String], slot_dir: Option<&Path>) -> Grants {
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let bin = canonical(bin);
    let mut read_exec: Vec<PathBuf> = ["/usr", "/lib", "/lib64"]
        .iter()
        .map(PathBuf::from)
        .collect();
    if let Some(dir) = bin.parent() {
        read_exec.push(dir.to_path_buf());
    }
    let mut read: Vec<PathBuf> = vec![
        canonical(model),
        PathBuf::from("/etc/ld.so.cache"),
        PathBuf::from("/sys/devices/system/cpu"),
        PathBuf::from("/proc/cpuinfo"),
        PathBuf::from("/dev/urandom"),
    ];
    // Files an argument names (a template, a projector, a LoRA, a draft model; relative ones
    // from the host's working directory, which the server shares); never a directory.
    for a in extra_args {
        let p = Path::new(a);
        if p.is_file() {
            read.push(canonical(p));
        }
    }
    // Offloading to a GPU needs its device nodes and driver files; its runtime reserves huge
    // address ranges, so no address-space limit then.
    let gpu = offloads_to_gpu(extra_args);
    let mut devices: Vec<PathBuf> = vec![PathBuf::from("/dev/null")];
    if gpu {
        read.extend(GPU_READ.iter().map(PathBuf::from));
        if let Ok(dir) = std::fs::read_dir("/dev") {
            devices.extend(dir.flatten().map(|e| e.path()).filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("nvidia"))
            }));
        }
        devices.extend(["/dev/dri", "/dev/kfd"].iter().map(PathBuf::from));
    }
    Grants {
        read_exec,
        read,
        read_write: slot_dir.map(canonical).into_iter().collect(),
        devices,
        connect: rpc_ports(extra_args),
        gpu,
    }
}

/// What was applied to a server, for its record.
struct Applied {
    mode: ServerIsolation,
    abi: u32,
    landlock: bool,
    filtered: bool,
    port: u16,
    address_space: u64,
}

impl Applied {
    /// The policy recorded in `model.loaded`, with the server's `view`.
    fn recorded(&self, g: &Grants, view: View) -> ServerPolicy {
        let abi = self.abi;
        let shown = |paths: &[PathBuf]| paths.iter().map(|p| p.display().to_string()).collect();
        let scoped = self.landlock && abi >= landlock::SCOPE_ABI;
        ServerPolicy::Confined(Box::new(Confined {
            mode: self.mode.as_str(),
            landlock_abi: abi,
            filesystem: self.landlock.then(|| Files {
                read_exec: shown(&g.read_exec),
                read: shown(&g.read),
                read_write: shown(&g.read_write),
            }),
            network: Network {
                tcp_bind: vec![self.port],
                tcp_connect_ports: g.connect.clone(),
                landlock_tcp: self.landlock && abi >= landlock::NET_ABI,
                socket_families: if self.filtered {
                    Families::Only(&["inet", "inet6", "netlink"])
                } else {
                    Families::Any("any")
                },
            },
            scopes: Scopes {
                signal: scoped,
                abstract_unix_socket: scoped,
            },
            syscall_floor: self.filtered,
            ipc: if self.filtered {
                "seccomp_denied"
            } else {
                "host"
            },
            uid: crate::sys::euid(),
            // Root can empty its bounding set; another uid holds no capability to begin with.
            capabilities: if crate::sys::euid() == 0 {
                "none"
            } else {
                "none_but_bounding_set"
            },
            no_new_privs: true,
            limits: Limits {
                address_space_bytes: (!g.gpu).then_some(self.address_space),
                core_dumps: false,
            },
            gpu_devices: g.gpu,
            view,
        }))
    }
}

/// Driver and device information a GPU runtime reads.
const GPU_READ: &[&str] = &[
    "/proc/driver/nvidia",
    "/sys/bus/pci",
    "/sys/devices",
    "/sys/class/drm",
];

/// Whether the arguments offload layers to a GPU (`-ngl`/`--n-gpu-layers`/`--gpu-layers`, or
/// the draft model's, with a count other than 0; or a `--device` other than `none`).
fn offloads_to_gpu(args: &[String]) -> bool {
    let mut it = args.iter().map(String::as_str);
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f, Some(v)),
            None => (a, None),
        };
        let off = match flag {
            "-ngl"
            | "--n-gpu-layers"
            | "--gpu-layers"
            | "-ngld"
            | "--n-gpu-layers-draft"
            | "--gpu-layers-draft" => "0",
            "-dev" | "--device" => "none",
            _ => continue,
        };
        let value = match inline {
            Some(v) => Some(v),
            None => it.next(),
        };
        if value.is_some_and(|v| v.trim() != off) {
            return true;
        }
    }
    false
}

/// The ports of `--rpc host:port,host:port` (the helpers a split model connects to).
fn rpc_ports(args: &[String]) -> Vec<u16> {
    let mut ports = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let list = match a.strip_prefix("--rpc=") {
            Some(v) => Some(v.to_owned()),
            None if a == "--rpc" => it.next().cloned(),
            None => None,
        };
        for endpoint in list.iter().flat_map(|l| l.split(',')) {
            if let Some(p) = endpoint
                .rsplit_once(':')
                .and_then(|(_, p)| p.trim().parse::<u16>().ok())
            {
                ports.push(p);
            }
        }
    }
    ports
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_ports_are_read_from_either_spelling() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            rpc_ports(&args(&[
                "--rpc",
                "10.0.0.2:50052,host3:50053",
                "-ngl",
                "99"
            ])),
            vec![50052, 50053]
        );
        assert_eq!(rpc_ports(&args(&["--rpc=h:7"])), vec![7]);
        assert!(rpc_ports(&args(&["--path", "/"])).is_empty());
    }

    #[test]
    fn gpu_offload_is_read_from_the_arguments() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(offloads_to_gpu(&args(&["-ngl", "99"])));
        assert!(offloads_to_gpu(&args(&["--n-gpu-layers=20"])));
        assert!(offloads_to_gpu(&args(&["--device", "CUDA0"])));
        assert!(!offloads_to_gpu(&args(&["-ngl", "0", "--device", "none"])));
        assert!(!offloads_to_gpu(&args(&[
            "--no-jinja",
            "--chat-template",
            "gemma"
        ])));
    }
}
