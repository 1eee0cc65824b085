//! The seccomp filter of a confined run, built from tables by a small assembler with symbolic
//! labels (no hand-counted jumps), and checked by a BPF interpreter in the tests.
//!
//! Every confined run gets the **floor** ([`FLOOR`]): syscalls no agent tool needs and every
//! container runtime's default profile refuses (mounts, modules, kexec, BPF, perf, keyrings,
//! file handles, userfaultfd, `setns`, clocks, swap, reboot, io_uring, the new mount API) fail
//! with `EPERM`; a user namespace (`unshare` or `clone` with `CLONE_NEWUSER`) fails with
//! `EPERM`; `clone3`, whose flags the filter cannot read, fails with `ENOSYS` so libc falls back
//! to `clone`. Where the run has no IPC namespace of its own, SysV IPC and POSIX message queues
//! fail with `EPERM` too ([`IPC`]).
//!
//! Without network ([`Sockets::UnixOnly`]): `socket` with any family but `AF_UNIX` fails
//! with `EACCES`, and so do `connect`, `sendto` with an address, and UNIX **datagram** sockets
//! (`socket` and `socketpair` with `SOCK_DGRAM`: `sendmsg` can carry a destination address the
//! filter cannot read, and a datagram socket would reach any socket on the host with it; stream
//! and seqpacket sockets ignore or refuse an address). So the UNIX sockets a run may make reach
//! nothing outside it: only socketpairs and sockets it binds itself work.
//!
//! A syscall from another ABI (i386 or x32 on x86-64) kills the process: its numbers would
//! bypass every check.

use libc::{sock_filter, sock_fprog};

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

// Offsets into struct seccomp_data: nr, arch, instruction pointer, then six 64-bit arguments.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const fn off_arg_low(n: u32) -> u32 {
    if cfg!(target_endian = "little") {
        16 + 8 * n
    } else {
        16 + 8 * n + 4
    }
}
const fn off_arg_high(n: u32) -> u32 {
    if cfg!(target_endian = "little") {
        16 + 8 * n + 4
    } else {
        16 + 8 * n
    }
}

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const AND_K: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// Whether this build has a filter for the target architecture.
pub(crate) const SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// Whether filters can be installed here: this build has one for the architecture, and the
/// kernel answers `seccomp(SECCOMP_GET_ACTION_AVAIL)` (Linux 4.14; `ENOSYS` without
/// `CONFIG_SECCOMP_FILTER`, and under tools such as valgrind that do not pass seccomp on).
/// Probed once.
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        const GET_ACTION_AVAIL: u32 = 2;
        let action: u32 = libc::SECCOMP_RET_ERRNO;
        SUPPORTED
            && super::syscall!(SYS_seccomp, GET_ACTION_AVAIL, 0u32, &action as *const u32).is_ok()
    })
}

/// What a filter returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Allow,
    Errno(i32),
    KillProcess,
    /// Held for the process holding the filter's listener, which answers it
    /// ([`super::mediate`]).
    Notify,
}

impl Action {
    fn value(self) -> u32 {
        match self {
            Action::Allow => libc::SECCOMP_RET_ALLOW,
            Action::Errno(e) => libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA),
            Action::KillProcess => libc::SECCOMP_RET_KILL_PROCESS,
            Action::Notify => libc::SECCOMP_RET_USER_NOTIF,
        }
    }
}

/// A place in the program a jump can name before it is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Label(usize);

/// Where a conditional jump goes.
#[derive(Clone, Copy, Debug)]
enum To {
    Next,
    L(Label),
}

enum Op {
    Stmt(u16, u32),
    Always(Label),
    Jump(u16, u32, To, To),
    Bind(Label),
}

/// A classic-BPF assembler whose jumps name labels; [`Asm::assemble`] resolves them (forward
/// only, as BPF requires, and refuses a jump longer than 255 instructions).
#[derive(Default)]
struct Asm {
    ops: Vec<Op>,
    labels: usize,
}

impl Asm {
    fn label(&mut self) -> Label {
        self.labels += 1;
        Label(self.labels - 1)
    }
    fn bind(&mut self, l: Label) {
        self.ops.push(Op::Bind(l));
    }
    fn load(&mut self, offset: u32) {
        self.ops.push(Op::Stmt(LD_W_ABS, offset));
    }
    fn and(&mut self, k: u32) {
        self.ops.push(Op::Stmt(AND_K, k));
    }
    fn jeq(&mut self, k: u32, t: To, f: To) {
        self.ops.push(Op::Jump(JEQ_K, k, t, f));
    }
    fn jge(&mut self, k: u32, t: To, f: To) {
        self.ops.push(Op::Jump(JGE_K, k, t, f));
    }
    fn jset(&mut self, k: u32, t: To, f: To) {
        self.ops.push(Op::Jump(JSET_K, k, t, f));
    }
    /// An unconditional jump (32-bit reach).
    fn ja(&mut self, to: Label) {
        self.ops.push(Op::Always(to));
    }
    fn ret(&mut self, a: Action) {
        self.ops.push(Op::Stmt(RET_K, a.value()));
    }

    fn assemble(self) -> Result<Vec<sock_filter>, String> {
        let mut at = vec![None; self.labels];
        let mut n = 0usize;
        for op in &self.ops {
            match op {
                Op::Bind(l) => at[l.0] = Some(n),
                _ => n += 1,
            }
        }
        let mut out = Vec::with_capacity(n);
        for op in &self.ops {
            let here = out.len();
            let offset = |to: To| -> Result<u8, String> {
                let target = match to {
                    To::Next => return Ok(0),
                    To::L(l) => at[l.0].ok_or("a jump to a label never bound")?,
                };
                let d = target
                    .checked_sub(here + 1)
                    .ok_or("a backward jump (BPF jumps forward only)")?;
                u8::try_from(d).map_err(|_| format!("a jump of {d} instructions (at most 255)"))
            };
            match *op {
                Op::Bind(_) => {}
                Op::Always(l) => {
                    let target = at[l.0].ok_or("a jump to a label never bound")?;
                    let d = target
                        .checked_sub(here + 1)
                        .ok_or("a backward jump (BPF jumps forward only)")?;
                    out.push(sock_filter {
                        code: JA,
                        jt: 0,
                        jf: 0,
                        k: u32::try_from(d).map_err(|_| "a jump too long")?,
                    });
                }
                Op::Stmt(code, k) => out.push(sock_filter {
                    code,
                    jt: 0,
                    jf: 0,
                    k,
                }),
                Op::Jump(code, k, t, f) => out.push(sock_filter {
                    code,
                    jt: offset(t)?,
                    jf: offset(f)?,
                    k,
                }),
            }
        }
        if out.len() > usize::from(u16::MAX) {
            return Err("the program is too long".into());
        }
        Ok(out)
    }
}

/// What one syscall's rule checks once its number matched.
#[derive(Clone, Copy, Debug)]
enum Check {
    /// Always refused with this action.
    Always(Action),
    /// Refused when argument `arg` (low 32 bits) has any bit of `mask`.
    AnyBit { arg: u32, mask: u32, then: Action },
    /// Refused when argument `arg` (low 32 bits) is not `value`.
    Not { arg: u32, value: u32, then: Action },
    /// Refused when `arg & mask` (low 32 bits) is none of `allowed`.
    MaskedNotIn {
        arg: u32,
        mask: u32,
        allowed: &'static [u32],
        then: Action,
    },
    /// Refused when the 64-bit argument `arg` is not zero (a pointer that is given).
    NonZero { arg: u32, then: Action },
}

/// One rule: a syscall by name (as recorded) and number, and its checks, all applied in order.
#[derive(Clone, Copy, Debug)]
struct Rule {
    name: &'static str,
    nr: libc::c_long,
    checks: &'static [Check],
}

const EPERM: Action = Action::Errno(libc::EPERM);
const EACCES: Action = Action::Errno(libc::EACCES);

macro_rules! deny {
    ($($name:ident),* $(,)?) => {
        &[$(Rule { name: stringify!($name), nr: paste_sys!($name), checks: &[Check::Always(EPERM)] }),*]
    };
}
#[rustfmt::skip]
macro_rules! paste_sys {
    (mount) => { libc::SYS_mount };
    (umount2) => { libc::SYS_umount2 };
    (pivot_root) => { libc::SYS_pivot_root };
    (swapon) => { libc::SYS_swapon };
    (swapoff) => { libc::SYS_swapoff };
    (reboot) => { libc::SYS_reboot };
    (kexec_load) => { libc::SYS_kexec_load };
    (kexec_file_load) => { libc::SYS_kexec_file_load };
    (init_module) => { libc::SYS_init_module };
    (finit_module) => { libc::SYS_finit_module };
    (delete_module) => { libc::SYS_delete_module };
    (bpf) => { libc::SYS_bpf };
    (perf_event_open) => { libc::SYS_perf_event_open };
    (keyctl) => { libc::SYS_keyctl };
    (add_key) => { libc::SYS_add_key };
    (request_key) => { libc::SYS_request_key };
    (open_by_handle_at) => { libc::SYS_open_by_handle_at };
    (name_to_handle_at) => { libc::SYS_name_to_handle_at };
    (userfaultfd) => { libc::SYS_userfaultfd };
    (setns) => { libc::SYS_setns };
    (settimeofday) => { libc::SYS_settimeofday };
    (clock_settime) => { libc::SYS_clock_settime };
    (clock_adjtime) => { libc::SYS_clock_adjtime };
    (adjtimex) => { libc::SYS_adjtimex };
    (acct) => { libc::SYS_acct };
    (quotactl) => { libc::SYS_quotactl };
    (quotactl_fd) => { libc::SYS_quotactl_fd };
    (syslog) => { libc::SYS_syslog };
    (io_uring_setup) => { libc::SYS_io_uring_setup };
    (io_uring_enter) => { libc::SYS_io_uring_enter };
    (io_uring_register) => { libc::SYS_io_uring_register };
    (open_tree) => { libc::SYS_open_tree };
    (move_mount) => { libc::SYS_move_mount };
    (fsopen) => { libc::SYS_fsopen };
    (fsconfig) => { libc::SYS_fsconfig };
    (fsmount) => { libc::SYS_fsmount };
    (fspick) => { libc::SYS_fspick };
    (mount_setattr) => { libc::SYS_mount_setattr };
    (vhangup) => { libc::SYS_vhangup };
    (iopl) => { libc::SYS_iopl };
    (ioperm) => { libc::SYS_ioperm };
    (shmget) => { libc::SYS_shmget };
    (shmat) => { libc::SYS_shmat };
    (shmctl) => { libc::SYS_shmctl };
    (shmdt) => { libc::SYS_shmdt };
    (semget) => { libc::SYS_semget };
    (semop) => { libc::SYS_semop };
    (semctl) => { libc::SYS_semctl };
    (semtimedop) => { libc::SYS_semtimedop };
    (msgget) => { libc::SYS_msgget };
    (msgsnd) => { libc::SYS_msgsnd };
    (msgrcv) => { libc::SYS_msgrcv };
    (msgctl) => { libc::SYS_msgctl };
    (mq_open) => { libc::SYS_mq_open };
    (mq_unlink) => { libc::SYS_mq_unlink };
    (mq_timedsend) => { libc::SYS_mq_timedsend };
    (mq_timedreceive) => { libc::SYS_mq_timedreceive };
    (mq_notify) => { libc::SYS_mq_notify };
    (mq_getsetattr) => { libc::SYS_mq_getsetattr };
}

/// The floor: refused in every confined run, whatever else the policy allows (with
/// [`ARCH_FLOOR`]).
#[rustfmt::skip]
const FLOOR: &[Rule] = deny![
    mount, umount2, pivot_root, swapon, swapoff, reboot, kexec_load, kexec_file_load,
    init_module, finit_module, delete_module, bpf, perf_event_open, keyctl, add_key,
    request_key, open_by_handle_at, name_to_handle_at, userfaultfd, setns, settimeofday,
    clock_settime, clock_adjtime, adjtimex, acct, quotactl, quotactl_fd, syslog, io_uring_setup,
    io_uring_enter, io_uring_register, open_tree, move_mount, fsopen, fsconfig, fsmount, fspick,
    mount_setattr, vhangup,
];
/// The floor's part that only x86 has: port I/O.
#[cfg(target_arch = "x86_64")]
const ARCH_FLOOR: &[Rule] = deny![iopl, ioperm];
/// The floor's part that only x86 has: port I/O.
#[cfg(not(target_arch = "x86_64"))]
const ARCH_FLOOR: &[Rule] = &[];

/// No nested user namespace (it would hand the run every capability inside it, and the
/// kernel's attack surface with them); `clone3` hides its flags in memory, so it is refused as
/// missing and libc falls back to `clone`.
const NAMESPACES: &[Rule] = &[
    Rule {
        name: "unshare(CLONE_NEWUSER)",
        nr: libc::SYS_unshare,
        checks: &[Check::AnyBit {
            arg: 0,
            mask: libc::CLONE_NEWUSER as u32,
            then: EPERM,
        }],
    },
    Rule {
        name: "clone(CLONE_NEWUSER)",
        nr: libc::SYS_clone,
        checks: &[Check::AnyBit {
            arg: 0,
            mask: libc::CLONE_NEWUSER as u32,
            then: EPERM,
        }],
    },
    Rule {
        name: "clone3",
        nr: libc::SYS_clone3,
        checks: &[Check::Always(Action::Errno(libc::ENOSYS))],
    },
];

/// SysV IPC and POSIX message queues: refused where the run has no IPC namespace of its own,
/// so it cannot reach the host's.
#[rustfmt::skip]
const IPC: &[Rule] = deny![
    shmget, shmat, shmctl, shmdt, semget, semop, semctl, semtimedop, msgget, msgsnd, msgrcv,
    msgctl, mq_open, mq_unlink, mq_timedsend, mq_timedreceive, mq_notify, mq_getsetattr,
];

/// `type & SOCK_TYPE_MASK` (the low bits; the rest are SOCK_NONBLOCK and SOCK_CLOEXEC).
const SOCK_TYPE_MASK: u32 = 0xf;
/// The UNIX socket types that can address nothing: a stream refuses an address on `sendmsg`,
/// a seqpacket socket ignores it. (The kernel turns `SOCK_RAW` into `SOCK_DGRAM`, so a list
/// of what is allowed, not of what is refused.)
const UNIX_CONNECTED_TYPES: &[u32] = &[libc::SOCK_STREAM as u32, libc::SOCK_SEQPACKET as u32];

/// Mode bits that make an executable run as its owner or group. On a root host a run's files
/// in its working dirs belong to the host user (the idmap), so a set-user-ID bit there would be
/// a root shell for every local user.
const SET_ID_BITS: u32 = libc::S_ISUID | libc::S_ISGID;

/// No set-user-ID or set-group-ID bit on anything a run creates or changes (`EPERM`); `openat2`
/// carries its mode in memory the filter cannot read, so it fails with `ENOSYS` (libc and
/// programs fall back to `openat`).
const NO_SET_ID: &[Rule] = &[
    Rule {
        name: "chmod(S_ISUID|S_ISGID)",
        nr: SYS_CHMOD,
        checks: &[Check::AnyBit {
            arg: 1,
            mask: SET_ID_BITS,
            then: EPERM,
        }],
    },
    Rule {
        name: "fchmod(S_ISUID|S_ISGID)",
        nr: libc::SYS_fchmod,
        checks: &[Check::AnyBit {
            arg: 1,
            mask: SET_ID_BITS,
            then: EPERM,
        }],
    },
    Rule {
        name: "fchmodat(S_ISUID|S_ISGID)",
        nr: libc::SYS_fchmodat,
        checks: &[Check::AnyBit {
            arg: 2,
            mask: SET_ID_BITS,
            then: EPERM,
        }],
    },
    Rule {
        name: "fchmodat2(S_ISUID|S_ISGID)",
        nr: SYS_FCHMODAT2,
        checks: &[Check::AnyBit {
            arg: 2,
            mask: SET_ID_BITS,
            then: EPERM,
        }],
    },
    Rule {
        name: "open(O_CREAT, S_ISUID|S_ISGID)",
        nr: SYS_OPEN,
        checks: &[Check::AnyBit {
            arg: 2,
            mask: SET_ID_BITS,
            then: EPERM,
        }],
    },
    Rule {
        name: "creat(S_ISUID|S_ISGID)",
        nr: SYS_CREAT,
        checks: &[Check::AnyBit {
            arg: 1,
            mask: SET_ID_BITS,
            then: EPERM,
        }],
    },
    Rule {
        name: "openat(O_CREAT, S_ISUID|S_ISGID)",
        nr: libc::SYS_openat,
        checks: &[Check::AnyBit {
            arg: 3,
            mask: SET_ID_BITS,
            then: EPERM,
        }],
    },
    Rule {
        name: "mknod(S_ISUID|S_ISGID)",
        nr: SYS_MKNOD,
        checks: &[Check::AnyBit {
            arg: 1,
            mask: SET_ID_BITS,
            then: EPERM,
        }],
    },
    Rule {
        name: "mknodat(S_ISUID|S_ISGID)",
        nr: libc::SYS_mknodat,
        checks: &[Check::AnyBit {
            arg: 2,
            mask: SET_ID_BITS,
            then: EPERM,
        }],
    },
    Rule {
        name: "openat2",
        nr: libc::SYS_openat2,
        checks: &[Check::Always(Action::Errno(libc::ENOSYS))],
    },
];

/// `fchmodat2` (Linux 6.6), by number: newer than some libc versions' tables.
const SYS_FCHMODAT2: libc::c_long = 452;
// `open`, `creat`, `chmod` and `mknod` exist only on x86-64 of the two architectures (aarch64
// has only the `*at` forms); elsewhere a number below 0 stands for them and the rule is left
// out.
#[cfg(target_arch = "x86_64")]
const SYS_OPEN: libc::c_long = libc::SYS_open;
#[cfg(target_arch = "x86_64")]
const SYS_CREAT: libc::c_long = libc::SYS_creat;
#[cfg(target_arch = "x86_64")]
const SYS_CHMOD: libc::c_long = libc::SYS_chmod;
#[cfg(target_arch = "x86_64")]
const SYS_MKNOD: libc::c_long = libc::SYS_mknod;
#[cfg(not(target_arch = "x86_64"))]
const SYS_OPEN: libc::c_long = -1;
#[cfg(not(target_arch = "x86_64"))]
const SYS_CREAT: libc::c_long = -2;
#[cfg(not(target_arch = "x86_64"))]
const SYS_CHMOD: libc::c_long = -3;
#[cfg(not(target_arch = "x86_64"))]
const SYS_MKNOD: libc::c_long = -4;

/// UNIX socketpairs of the types that can address nothing (another family's pair, such as
/// TIPC's, would be a socket of the host's network).
const SOCKETPAIR_CONNECTED: Rule = Rule {
    name: "socketpair(not AF_UNIX, or not SOCK_STREAM or SOCK_SEQPACKET)",
    nr: libc::SYS_socketpair,
    checks: UNIX_CONNECTED,
};

/// `socket` or `socketpair` of `AF_UNIX` and a type that can address nothing, else `EACCES`.
const UNIX_CONNECTED: &[Check] = &[
    Check::Not {
        arg: 0,
        value: libc::AF_UNIX as u32,
        then: EACCES,
    },
    Check::MaskedNotIn {
        arg: 1,
        mask: SOCK_TYPE_MASK,
        allowed: UNIX_CONNECTED_TYPES,
        then: EACCES,
    },
];

/// A send that names where it goes (a datagram's address).
const SENDTO_ADDRESSED: Rule = Rule {
    name: "sendto(with an address)",
    nr: libc::SYS_sendto,
    checks: &[Check::NonZero {
        arg: 4,
        then: EACCES,
    }],
};

/// No network: only UNIX sockets, and none that can address a socket outside the run.
const NO_NETWORK: &[Rule] = &[
    Rule {
        name: "socket(not AF_UNIX, or not SOCK_STREAM or SOCK_SEQPACKET)",
        nr: libc::SYS_socket,
        checks: UNIX_CONNECTED,
    },
    SOCKETPAIR_CONNECTED,
    Rule {
        name: "connect",
        nr: libc::SYS_connect,
        checks: &[Check::Always(EACCES)],
    },
    SENDTO_ADDRESSED,
];

/// Network only through a run's proxy (its network namespace holds nothing else): TCP
/// sockets only, so no UDP (no DNS of the run's own), raw, packet or netlink socket, and no
/// UNIX socket but a socketpair's: `connect` is allowed (to reach the proxy), and it cannot
/// tell a UNIX socket's path (a Docker or D-Bus socket the filesystem rules leave in reach)
/// from an address, so the run gets no UNIX socket to connect with.
const PROXIED: &[Rule] = &[TCP_SOCKETS_ONLY, SOCKETPAIR_CONNECTED, SENDTO_ADDRESSED];

/// TCP sockets (protocol 0 or `IPPROTO_TCP`: SCTP and MPTCP streams are other protocols).
const TCP_SOCKETS_ONLY: Rule = Rule {
    name: "socket(not AF_INET or AF_INET6, or not SOCK_STREAM, or not TCP)",
    nr: libc::SYS_socket,
    checks: &[
        Check::MaskedNotIn {
            arg: 0,
            mask: u32::MAX,
            allowed: &[libc::AF_INET as u32, libc::AF_INET6 as u32],
            then: EACCES,
        },
        Check::MaskedNotIn {
            arg: 1,
            mask: SOCK_TYPE_MASK,
            allowed: &[libc::SOCK_STREAM as u32],
            then: EACCES,
        },
        Check::MaskedNotIn {
            arg: 2,
            mask: u32::MAX,
            allowed: &[0, libc::IPPROTO_TCP as u32],
            then: EACCES,
        },
    ],
};

/// `MSG_FASTOPEN`: a send that connects (to the address it carries, which the filter cannot
/// read).
const FASTOPEN: u32 = libc::MSG_FASTOPEN as u32;

/// Network only through a run's proxy where the run shares the host's network (no namespace
/// could be made): TCP sockets as [`PROXIED`], and every `connect` held for correx, which reads
/// the address and puts a socket of its own, connected to the proxy, in the run's place, or
/// refuses ([`super::mediate`]). No other way to start a connection or take one: no `sendto`
/// with an address, no send with `MSG_FASTOPEN`, no `bind` or `listen` (a listener on the
/// host's network would be a way in), no seccomp listener of the run's own.
const MEDIATED: &[Rule] = &[
    TCP_SOCKETS_ONLY,
    SOCKETPAIR_CONNECTED,
    Rule {
        name: "connect (held for correx)",
        nr: libc::SYS_connect,
        checks: &[Check::Always(Action::Notify)],
    },
    Rule {
        name: "sendto(with an address, or MSG_FASTOPEN)",
        nr: libc::SYS_sendto,
        checks: &[
            Check::NonZero {
                arg: 4,
                then: EACCES,
            },
            Check::AnyBit {
                arg: 3,
                mask: FASTOPEN,
                then: EACCES,
            },
        ],
    },
    Rule {
        name: "sendmsg(MSG_FASTOPEN)",
        nr: libc::SYS_sendmsg,
        checks: &[Check::AnyBit {
            arg: 2,
            mask: FASTOPEN,
            then: EACCES,
        }],
    },
    Rule {
        name: "sendmmsg(MSG_FASTOPEN)",
        nr: libc::SYS_sendmmsg,
        checks: &[Check::AnyBit {
            arg: 3,
            mask: FASTOPEN,
            then: EACCES,
        }],
    },
    Rule {
        name: "bind",
        nr: libc::SYS_bind,
        checks: &[Check::Always(EACCES)],
    },
    Rule {
        name: "listen",
        nr: libc::SYS_listen,
        checks: &[Check::Always(EACCES)],
    },
    // A filter of the run's own with a listener would answer its own connects once correx's
    // listener is closed (a process outliving its run).
    Rule {
        name: "seccomp(SECCOMP_FILTER_FLAG_NEW_LISTENER)",
        nr: libc::SYS_seccomp,
        checks: &[Check::AnyBit {
            arg: 1,
            mask: libc::SECCOMP_FILTER_FLAG_NEW_LISTENER as u32,
            then: EPERM,
        }],
    },
];

/// TCP/IP and netlink sockets only; socketpairs that can address nothing.
const INET_ONLY: &[Rule] = &[
    Rule {
        name: "socket(not AF_INET, AF_INET6 or AF_NETLINK)",
        nr: libc::SYS_socket,
        checks: &[Check::MaskedNotIn {
            arg: 0,
            mask: u32::MAX,
            allowed: &[
                libc::AF_INET as u32,
                libc::AF_INET6 as u32,
                libc::AF_NETLINK as u32,
            ],
            then: EACCES,
        }],
    },
    SOCKETPAIR_CONNECTED,
];

/// What a filter covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Options {
    /// The floor (and no nested user namespace); false where the spawner thread holds it.
    pub floor: bool,
    /// `mount` and `setns` apart from the rest of the floor: a floor without them (a spawner
    /// thread whose runs' supervisors enter a mount namespace and mount their own /proc), or
    /// with `floor` false, those two alone (the run's own filter over such a thread's).
    pub split_mount: bool,
    /// Refuse SysV IPC and message queues (the run has no IPC namespace).
    pub deny_ipc: bool,
    /// Which sockets the run may make and what they may reach.
    pub sockets: Sockets,
}

/// The socket rules of a filter: one network mode each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sockets {
    /// Every socket (no network rules).
    Any,
    /// Sockets of TCP/IP and netlink only, socketpairs of streams only (a server that needs
    /// TCP but must reach no UNIX socket) ([`INET_ONLY`]).
    InetOnly,
    /// `AF_UNIX` only, and no datagrams ([`NO_NETWORK`]).
    UnixOnly,
    /// TCP too, for a run whose network namespace holds only its proxy ([`PROXIED`]).
    Proxied,
    /// As proxied, but the run shares the host's network: every `connect` is held for correx
    /// ([`MEDIATED`]; the filter is installed with a listener).
    Mediated,
}

/// A BPF program, kept alive for a child to install.
#[derive(Clone, Debug)]
pub(crate) struct Filter {
    program: Vec<sock_filter>,
}

/// The rules a filter with `options` applies, in order.
fn rules(options: Options) -> Vec<Rule> {
    let mut all: Vec<Rule> = Vec::new();
    let mount = |r: &&Rule| r.nr == libc::SYS_mount || r.nr == libc::SYS_setns;
    match (options.floor, options.split_mount) {
        (true, false) => all.extend(
            FLOOR
                .iter()
                .chain(ARCH_FLOOR)
                .chain(NAMESPACES)
                .chain(NO_SET_ID),
        ),
        (true, true) => all.extend(
            FLOOR
                .iter()
                .filter(|r| !mount(r))
                .chain(ARCH_FLOOR)
                .chain(NAMESPACES)
                .chain(NO_SET_ID),
        ),
        (false, true) => all.extend(FLOOR.iter().filter(mount)),
        (false, false) => {}
    }
    if options.deny_ipc {
        all.extend_from_slice(IPC);
    }
    all.extend_from_slice(match options.sockets {
        Sockets::Any => &[],
        Sockets::InetOnly => INET_ONLY,
        Sockets::UnixOnly => NO_NETWORK,
        Sockets::Proxied => PROXIED,
        Sockets::Mediated => MEDIATED,
    });
    // Numbers below 0 stand for syscalls this architecture does not have.
    all.retain(|r| r.nr >= 0);
    all
}

/// The names of the syscalls the floor refuses, as recorded in the applied policy.
pub(crate) fn floor_names() -> Vec<&'static str> {
    FLOOR
        .iter()
        .chain(ARCH_FLOOR)
        .chain(NAMESPACES)
        .chain(NO_SET_ID)
        .filter(|r| r.nr >= 0)
        .map(|r| r.name)
        .collect()
}

fn compile(rules: &[Rule]) -> Result<Vec<sock_filter>, String> {
    let mut a = Asm::default();
    // Another ABI is killed at once (its returns stand here, within a short jump's reach).
    let native = a.label();
    a.load(OFF_ARCH);
    a.jeq(AUDIT_ARCH, To::L(native), To::Next);
    a.ret(Action::KillProcess);
    a.bind(native);
    a.load(OFF_NR);
    if cfg!(target_arch = "x86_64") {
        // x32 syscalls carry this bit and the x86-64 arch value; -1 (no syscall, which the
        // kernel answers with ENOSYS) is not one.
        let x64 = a.label();
        a.jeq(u32::MAX, To::L(x64), To::Next);
        a.jge(0x4000_0000, To::Next, To::L(x64));
        a.ret(Action::KillProcess);
        a.bind(x64);
    }
    // Each rule's target: its body, or (for rules that only return) one return per action.
    let mut shared: Vec<(Action, Label)> = Vec::new();
    let mut bodies: Vec<(Label, &Rule)> = Vec::new();
    let mut arms: Vec<(u32, Label)> = Vec::new();
    for rule in rules {
        let target = match rule.checks {
            [Check::Always(action)] => match shared.iter().find(|(a, _)| a == action) {
                Some((_, l)) => *l,
                None => {
                    let l = a.label();
                    shared.push((*action, l));
                    l
                }
            },
            _ => {
                let l = a.label();
                bodies.push((l, rule));
                l
            }
        };
        arms.push((rule.nr as u32, target));
    }
    arms.sort_by_key(|(nr, _)| *nr);
    if let Some(w) = arms.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(format!("two rules for syscall {}", w[0].0));
    }
    let allow = a.label();
    dispatch(&mut a, &arms, allow);
    a.bind(allow);
    a.ret(Action::Allow);
    for (action, l) in shared {
        a.bind(l);
        a.ret(action);
    }
    for (l, rule) in bodies {
        a.bind(l);
        for check in rule.checks {
            match *check {
                Check::Always(action) => a.ret(action),
                Check::AnyBit { arg, mask, then } => {
                    let next = a.label();
                    a.load(off_arg_low(arg));
                    a.jset(mask, To::Next, To::L(next));
                    a.ret(then);
                    a.bind(next);
                }
                Check::Not { arg, value, then } => {
                    let next = a.label();
                    a.load(off_arg_low(arg));
                    a.jeq(value, To::L(next), To::Next);
                    a.ret(then);
                    a.bind(next);
                }
                Check::MaskedNotIn {
                    arg,
                    mask,
                    allowed,
                    then,
                } => {
                    let next = a.label();
                    a.load(off_arg_low(arg));
                    a.and(mask);
                    for value in allowed {
                        a.jeq(*value, To::L(next), To::Next);
                    }
                    a.ret(then);
                    a.bind(next);
                }
                Check::NonZero { arg, then } => {
                    let next = a.label();
                    let deny = a.label();
                    a.load(off_arg_low(arg));
                    a.jeq(0, To::Next, To::L(deny));
                    a.load(off_arg_high(arg));
                    a.jeq(0, To::L(next), To::Next);
                    a.bind(deny);
                    a.ret(then);
                    a.bind(next);
                }
            }
        }
        // Every check passed: the call is allowed.
        a.ret(Action::Allow);
    }
    a.assemble()
}

/// A binary search on the syscall number (in the accumulator) over `arms`, sorted: a few
/// comparisons per syscall instead of one per rule, at run time and when the kernel builds its
/// per-syscall cache of what the filter always allows (at install, for every syscall number:
/// a linear list made that cost a third of a spawn).
fn dispatch(a: &mut Asm, arms: &[(u32, Label)], allow: Label) {
    if arms.len() <= 4 {
        for &(nr, target) in arms {
            let skip = a.label();
            a.jeq(nr, To::Next, To::L(skip));
            a.ja(target);
            a.bind(skip);
        }
        a.ja(allow);
        return;
    }
    let (low, high) = arms.split_at(arms.len() / 2);
    let right = a.label();
    let left = a.label();
    // A conditional jump reaches 255 instructions, a subtree can be longer: go right by an
    // unconditional jump.
    a.jge(high[0].0, To::Next, To::L(left));
    a.ja(right);
    a.bind(left);
    dispatch(a, low, allow);
    a.bind(right);
    dispatch(a, high, allow);
}

impl Filter {
    /// The filter for `options`; `None` on an architecture without one, or when `options`
    /// refuse nothing.
    ///
    /// # Errors
    /// The tables do not assemble (a bug: a unit test assembles every variant); callers fail
    /// closed rather than run unfiltered.
    pub fn new(options: Options) -> Result<Option<Filter>, String> {
        if !SUPPORTED
            || (!options.floor
                && !options.split_mount
                && !options.deny_ipc
                && options.sockets == Sockets::Any)
        {
            return Ok(None);
        }
        compile(&rules(options))
            .map(|program| Some(Filter { program }))
            .map_err(|e| format!("the seccomp filter does not assemble: {e}"))
    }

    /// A copy of the instructions, for a plan that must own them.
    pub fn instructions(&self) -> Vec<sock_filter> {
        self.program.clone()
    }
}

/// A `sock_fprog` pointing into `program`; valid while it lives, unmoved.
pub(crate) fn prog_of(program: &[sock_filter]) -> sock_fprog {
    sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut sock_filter,
    }
}

#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod tests {
    use super::*;

    /// A classic-BPF interpreter for the instructions the assembler emits, over a
    /// `seccomp_data` of (nr, arch, args).
    fn eval(program: &[sock_filter], nr: libc::c_long, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as u32).to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        loop {
            let i = program[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => {
                    let k = i.k as usize;
                    acc = u32::from_ne_bytes(data[k..k + 4].try_into().unwrap());
                }
                AND_K => acc &= i.k,
                JA => pc += i.k as usize,
                RET_K => return i.k,
                JEQ_K | JGE_K | JSET_K => {
                    let taken = match i.code {
                        JEQ_K => acc == i.k,
                        JGE_K => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                other => panic!("unexpected instruction {other:#x}"),
            }
        }
    }

    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    fn errno(e: i32) -> u32 {
        libc::SECCOMP_RET_ERRNO | e as u32
    }

    fn run(options: Options, nr: libc::c_long, args: [u64; 6]) -> u32 {
        let f = Filter::new(options).expect("assembles").expect("a filter");
        eval(&f.program, nr, AUDIT_ARCH, args)
    }

    const ALL: [Options; 4] = [
        Options {
            floor: true,
            split_mount: false,
            sockets: Sockets::UnixOnly,
            deny_ipc: false,
        },
        Options {
            floor: true,
            split_mount: false,
            sockets: Sockets::Any,
            deny_ipc: false,
        },
        Options {
            floor: true,
            split_mount: false,
            sockets: Sockets::UnixOnly,
            deny_ipc: true,
        },
        Options {
            floor: true,
            split_mount: false,
            sockets: Sockets::Any,
            deny_ipc: true,
        },
    ];

    #[test]
    fn every_floor_rule_refuses_its_syscall_with_eperm_in_every_variant() {
        for o in ALL {
            for rule in FLOOR.iter().chain(ARCH_FLOOR) {
                assert_eq!(run(o, rule.nr, [0; 6]), errno(libc::EPERM), "{}", rule.name);
            }
            // Everyday syscalls pass.
            for nr in [
                libc::SYS_read,
                libc::SYS_write,
                libc::SYS_execve,
                libc::SYS_wait4,
                libc::SYS_getpid,
            ] {
                assert_eq!(run(o, nr, [0; 6]), ALLOW, "syscall {nr}");
            }
        }
    }

    #[test]
    fn no_set_id_bit_can_be_given() {
        let suid = libc::S_ISUID as u64 | 0o755;
        let sgid = libc::S_ISGID as u64 | 0o755;
        let creat = (libc::O_CREAT | libc::O_WRONLY) as u64;
        for o in ALL {
            for mode in [suid, sgid] {
                assert_eq!(
                    run(o, libc::SYS_fchmod, [3, mode, 0, 0, 0, 0]),
                    errno(libc::EPERM)
                );
                assert_eq!(
                    run(o, libc::SYS_fchmodat, [3, 0, mode, 0, 0, 0]),
                    errno(libc::EPERM)
                );
                assert_eq!(
                    run(o, SYS_FCHMODAT2, [3, 0, mode, 0, 0, 0]),
                    errno(libc::EPERM)
                );
                assert_eq!(
                    run(o, libc::SYS_openat, [3, 0, creat, mode, 0, 0]),
                    errno(libc::EPERM)
                );
                assert_eq!(
                    run(o, libc::SYS_mknodat, [3, 0, mode, 0, 0, 0]),
                    errno(libc::EPERM)
                );
                #[cfg(target_arch = "x86_64")]
                {
                    assert_eq!(
                        run(o, libc::SYS_chmod, [0, mode, 0, 0, 0, 0]),
                        errno(libc::EPERM)
                    );
                    assert_eq!(
                        run(
                            o,
                            libc::SYS_mknod,
                            [0, mode | libc::S_IFREG as u64, 0, 0, 0, 0]
                        ),
                        errno(libc::EPERM)
                    );
                    assert_eq!(
                        run(o, libc::SYS_open, [0, creat, mode, 0, 0, 0]),
                        errno(libc::EPERM)
                    );
                    assert_eq!(
                        run(o, libc::SYS_creat, [0, mode, 0, 0, 0, 0]),
                        errno(libc::EPERM)
                    );
                }
            }
            // Ordinary modes and opens pass.
            assert_eq!(run(o, libc::SYS_fchmod, [3, 0o755, 0, 0, 0, 0]), ALLOW);
            assert_eq!(run(o, libc::SYS_openat, [3, 0, creat, 0o644, 0, 0]), ALLOW);
            assert_eq!(run(o, libc::SYS_openat, [3, 0, 0, 0, 0, 0]), ALLOW);
            assert_eq!(
                run(o, libc::SYS_openat2, [3, 0, 0, 24, 0, 0]),
                errno(libc::ENOSYS)
            );
        }
    }

    #[test]
    fn user_namespaces_are_refused_and_plain_clones_pass() {
        let newuser = libc::CLONE_NEWUSER as u64;
        for o in ALL {
            assert_eq!(
                run(o, libc::SYS_unshare, [newuser, 0, 0, 0, 0, 0]),
                errno(libc::EPERM)
            );
            assert_eq!(
                run(o, libc::SYS_clone, [newuser | 17, 0, 0, 0, 0, 0]),
                errno(libc::EPERM)
            );
            assert_eq!(
                run(
                    o,
                    libc::SYS_unshare,
                    [libc::CLONE_FILES as u64, 0, 0, 0, 0, 0]
                ),
                ALLOW
            );
            assert_eq!(run(o, libc::SYS_clone, [17, 0, 0, 0, 0, 0]), ALLOW);
            assert_eq!(run(o, libc::SYS_clone3, [0; 6]), errno(libc::ENOSYS));
        }
    }

    #[test]
    fn a_split_floor_leaves_mount_and_setns_to_the_runs_own_filter() {
        let thread = Options {
            floor: true,
            split_mount: true,
            sockets: Sockets::Any,
            deny_ipc: false,
        };
        let run_own = Options {
            floor: false,
            ..thread
        };
        for nr in [libc::SYS_mount, libc::SYS_setns] {
            // The spawner thread's floor lets its supervisors mount their /proc ...
            assert_eq!(run(thread, nr, [0; 6]), ALLOW);
            // ... and the run's own filter, stacked over it, refuses both.
            assert_eq!(run(run_own, nr, [0; 6]), errno(libc::EPERM));
        }
        // The rest of the floor stays on the thread, and off the run's own filter.
        for nr in [libc::SYS_umount2, libc::SYS_pivot_root, libc::SYS_bpf] {
            assert_eq!(run(thread, nr, [0; 6]), errno(libc::EPERM));
            assert_eq!(run(run_own, nr, [0; 6]), ALLOW);
        }
    }

    #[test]
    fn ipc_is_refused_only_without_an_ipc_namespace() {
        for o in ALL {
            for rule in IPC {
                let want = if o.deny_ipc {
                    errno(libc::EPERM)
                } else {
                    ALLOW
                };
                assert_eq!(run(o, rule.nr, [0; 6]), want, "{} {o:?}", rule.name);
            }
        }
    }

    #[test]
    fn without_network_only_unix_stream_sockets_that_address_nothing_remain() {
        let unix = libc::AF_UNIX as u64;
        let stream = libc::SOCK_STREAM as u64;
        let dgram = libc::SOCK_DGRAM as u64;
        let flags = (libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as u64;
        let eacces = errno(libc::EACCES);
        for o in ALL {
            let deny = |allowed: bool| {
                if o.sockets == Sockets::Any || allowed {
                    ALLOW
                } else {
                    eacces
                }
            };
            let socket = |family: u64, ty: u64| run(o, libc::SYS_socket, [family, ty, 0, 0, 0, 0]);
            assert_eq!(socket(unix, stream), ALLOW);
            assert_eq!(socket(unix, stream | flags), ALLOW);
            assert_eq!(socket(unix, libc::SOCK_SEQPACKET as u64), ALLOW);
            assert_eq!(socket(unix, dgram), deny(false));
            // The kernel makes a UNIX SOCK_RAW a datagram socket.
            assert_eq!(socket(unix, libc::SOCK_RAW as u64), deny(false));
            assert_eq!(socket(unix, libc::SOCK_RDM as u64), deny(false));
            assert_eq!(socket(unix, dgram | flags), deny(false));
            assert_eq!(socket(libc::AF_INET as u64, stream), deny(false));
            assert_eq!(socket(libc::AF_INET6 as u64, dgram), deny(false));
            assert_eq!(socket(libc::AF_NETLINK as u64, dgram), deny(false));
            // The family is compared in full: AF_UNIX plus high bits is not AF_UNIX.
            assert_eq!(socket(unix | 0x100, stream), deny(false));
            let pair = |ty: u64| run(o, libc::SYS_socketpair, [unix, ty, 0, 0, 0, 0]);
            assert_eq!(pair(stream), ALLOW);
            assert_eq!(pair(dgram | flags), deny(false));
            assert_eq!(pair(libc::SOCK_RAW as u64), deny(false));
            assert_eq!(pair(libc::SOCK_SEQPACKET as u64 | flags), ALLOW);
            assert_eq!(run(o, libc::SYS_connect, [3, 0, 0, 0, 0, 0]), deny(false));
            let sendto = |addr: u64| run(o, libc::SYS_sendto, [3, 0, 0, 0, addr, 0]);
            assert_eq!(sendto(0), ALLOW);
            assert_eq!(sendto(0x7fff_0000_1000), deny(false));
            assert_eq!(sendto(1 << 40), deny(false), "a high-word-only address");
            // sendmsg stays: with no datagram socket and no connect it can reach nobody.
            assert_eq!(run(o, libc::SYS_sendmsg, [3, 0, 0, 0, 0, 0]), ALLOW);
        }
    }

    #[test]
    fn through_a_proxy_only_tcp_sockets_and_socketpairs_remain() {
        let eacces = errno(libc::EACCES);
        for deny_ipc in [false, true] {
            let o = Options {
                floor: true,
                split_mount: false,
                sockets: Sockets::Proxied,
                deny_ipc,
            };
            let socket = |family: i32, ty: i32| {
                run(o, libc::SYS_socket, [family as u64, ty as u64, 0, 0, 0, 0])
            };
            let cloexec = libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
            assert_eq!(socket(libc::AF_INET, libc::SOCK_STREAM | cloexec), ALLOW);
            assert_eq!(socket(libc::AF_INET6, libc::SOCK_STREAM), ALLOW);
            // connect is open: a UNIX socket could reach a Docker or D-Bus socket by path.
            assert_eq!(socket(libc::AF_UNIX, libc::SOCK_STREAM), eacces);
            assert_eq!(socket(libc::AF_UNIX, libc::SOCK_SEQPACKET), eacces);
            assert_eq!(socket(libc::AF_INET, libc::SOCK_SEQPACKET), eacces, "SCTP");
            assert_eq!(
                run(
                    o,
                    libc::SYS_socketpair,
                    [libc::AF_UNIX as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0]
                ),
                ALLOW
            );
            // No DNS of its own, no raw packets, no route or interface changes.
            assert_eq!(socket(libc::AF_INET, libc::SOCK_DGRAM), eacces);
            assert_eq!(socket(libc::AF_INET6, libc::SOCK_DGRAM | cloexec), eacces);
            assert_eq!(socket(libc::AF_INET, libc::SOCK_RAW), eacces);
            assert_eq!(socket(libc::AF_PACKET, libc::SOCK_RAW), eacces);
            assert_eq!(socket(libc::AF_NETLINK, libc::SOCK_DGRAM), eacces);
            assert_eq!(socket(libc::AF_UNIX, libc::SOCK_DGRAM), eacces);
            assert_eq!(run(o, libc::SYS_connect, [3, 0, 0, 0, 0, 0]), ALLOW);
            assert_eq!(
                run(o, libc::SYS_sendto, [3, 0, 0, 0, 0x7fff_0000_1000, 0]),
                eacces
            );
            // The floor is still there.
            assert_eq!(
                run(
                    o,
                    libc::SYS_unshare,
                    [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0]
                ),
                errno(libc::EPERM)
            );
        }
    }

    #[test]
    fn mediated_every_connect_is_held_and_nothing_else_starts_a_connection() {
        let eacces = errno(libc::EACCES);
        let o = Options {
            floor: true,
            split_mount: false,
            sockets: Sockets::Mediated,
            deny_ipc: false,
        };
        let socket = |family: i32, ty: i32, protocol: i32| {
            run(
                o,
                libc::SYS_socket,
                [family as u64, ty as u64, protocol as u64, 0, 0, 0],
            )
        };
        assert_eq!(socket(libc::AF_INET, libc::SOCK_STREAM, 0), ALLOW);
        assert_eq!(
            socket(libc::AF_INET6, libc::SOCK_STREAM, libc::IPPROTO_TCP),
            ALLOW
        );
        // SCTP's one-to-one sockets are streams that can connect by sendmsg.
        assert_eq!(
            socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP),
            eacces
        );
        assert_eq!(socket(libc::AF_INET, libc::SOCK_DGRAM, 0), eacces);
        assert_eq!(socket(libc::AF_UNIX, libc::SOCK_STREAM, 0), eacces);
        assert_eq!(
            run(o, libc::SYS_connect, [3, 0x1000, 16, 0, 0, 0]),
            libc::SECCOMP_RET_USER_NOTIF
        );
        let fastopen = libc::MSG_FASTOPEN as u64;
        assert_eq!(run(o, libc::SYS_sendto, [3, 0, 1, fastopen, 0, 0]), eacces);
        assert_eq!(run(o, libc::SYS_sendto, [3, 0, 1, 0, 0x1000, 16]), eacces);
        assert_eq!(run(o, libc::SYS_sendto, [3, 0, 1, 0, 0, 0]), ALLOW);
        assert_eq!(run(o, libc::SYS_sendmsg, [3, 0, fastopen, 0, 0, 0]), eacces);
        assert_eq!(run(o, libc::SYS_sendmsg, [3, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(
            run(o, libc::SYS_sendmmsg, [3, 0, 1, fastopen, 0, 0]),
            eacces
        );
        assert_eq!(run(o, libc::SYS_bind, [3, 0x1000, 16, 0, 0, 0]), eacces);
        assert_eq!(run(o, libc::SYS_listen, [3, 1, 0, 0, 0, 0]), eacces);
        let new_listener = libc::SECCOMP_FILTER_FLAG_NEW_LISTENER;
        assert_eq!(
            run(o, libc::SYS_seccomp, [1, new_listener, 0x1000, 0, 0, 0]),
            errno(libc::EPERM)
        );
        assert_eq!(run(o, libc::SYS_seccomp, [1, 0, 0x1000, 0, 0, 0]), ALLOW);
        assert_eq!(
            run(
                o,
                libc::SYS_socketpair,
                [
                    libc::AF_TIPC as u64,
                    libc::SOCK_SEQPACKET as u64,
                    0,
                    0,
                    0,
                    0
                ]
            ),
            eacces
        );
        // Not mediated (a namespace of its own): connect, bind and listen are the run's own.
        let ns = Options {
            sockets: Sockets::Proxied,
            ..o
        };
        assert_eq!(run(ns, libc::SYS_connect, [3, 0x1000, 16, 0, 0, 0]), ALLOW);
        assert_eq!(run(ns, libc::SYS_listen, [3, 1, 0, 0, 0, 0]), ALLOW);
    }

    #[test]
    fn without_the_floor_only_the_rest_is_checked() {
        let o = Options {
            floor: false,
            split_mount: false,
            sockets: Sockets::UnixOnly,
            deny_ipc: false,
        };
        assert_eq!(run(o, libc::SYS_mount, [0; 6]), ALLOW);
        assert_eq!(run(o, libc::SYS_connect, [0; 6]), errno(libc::EACCES));
        let none = Options {
            floor: false,
            split_mount: false,
            sockets: Sockets::Any,
            deny_ipc: false,
        };
        assert!(
            Filter::new(none).expect("assembles").is_none(),
            "a filter that refuses nothing"
        );
    }

    #[test]
    fn a_server_gets_tcp_ip_and_netlink_sockets_only() {
        let o = Options {
            floor: true,
            split_mount: false,
            sockets: Sockets::InetOnly,
            deny_ipc: true,
        };
        let socket =
            |family: i32, ty: i32| run(o, libc::SYS_socket, [family as u64, ty as u64, 0, 0, 0, 0]);
        assert_eq!(socket(libc::AF_INET, libc::SOCK_STREAM), ALLOW);
        assert_eq!(socket(libc::AF_INET6, libc::SOCK_DGRAM), ALLOW);
        assert_eq!(socket(libc::AF_NETLINK, libc::SOCK_RAW), ALLOW);
        for family in [libc::AF_UNIX, libc::AF_PACKET, libc::AF_VSOCK, libc::AF_ALG] {
            assert_eq!(
                socket(family, libc::SOCK_STREAM),
                errno(libc::EACCES),
                "{family}"
            );
        }
        let pair = |ty: i32| run(o, libc::SYS_socketpair, [1, ty as u64, 0, 0, 0, 0]);
        assert_eq!(pair(libc::SOCK_STREAM), ALLOW);
        assert_eq!(pair(libc::SOCK_DGRAM), errno(libc::EACCES));
        assert_eq!(run(o, libc::SYS_connect, [3, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(run(o, libc::SYS_shmget, [0; 6]), errno(libc::EPERM));
    }

    #[test]
    fn other_abis_are_killed() {
        let f = Filter::new(ALL[0]).expect("assembles").expect("a filter");
        let kill = libc::SECCOMP_RET_KILL_PROCESS;
        assert_eq!(eval(&f.program, libc::SYS_read, 0x4000_0003, [0; 6]), kill);
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(
                eval(&f.program, libc::SYS_read | 0x4000_0000, AUDIT_ARCH, [0; 6]),
                kill
            );
            // syscall(-1) is no x32 call: the kernel answers it with ENOSYS.
            assert_eq!(eval(&f.program, -1, AUDIT_ARCH, [0; 6]), ALLOW);
        }
    }

    #[test]
    fn the_assembler_refuses_what_bpf_cannot_express() {
        let mut a = Asm::default();
        let l = a.label();
        a.jeq(0, To::L(l), To::Next);
        assert!(a.assemble().is_err(), "an unbound label");
        let mut a = Asm::default();
        let l = a.label();
        a.bind(l);
        a.ret(Action::Allow);
        a.jeq(0, To::L(l), To::Next);
        assert!(a.assemble().is_err(), "a backward jump");
        let mut a = Asm::default();
        let l = a.label();
        a.jeq(0, To::L(l), To::Next);
        for _ in 0..300 {
            a.ret(Action::Allow);
        }
        a.bind(l);
        a.ret(Action::Allow);
        assert!(a.assemble().is_err(), "a jump past 255");
    }
}
