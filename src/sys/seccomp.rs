//! A seccomp filter, assembled by hand, that leaves a child no sockets but `AF_UNIX`: `socket`
//! with any other family fails with `EACCES`, `io_uring_setup` (which can open sockets on its
//! own) fails with `EPERM`, and a syscall from another ABI (i386 or x32 on x86-64) kills the
//! process, since its numbers would bypass the checks.

use libc::{sock_filter, sock_fprog};

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

// Offsets into struct seccomp_data.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
#[cfg(target_endian = "little")]
const OFF_ARG0_LOW: u32 = 16;

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
#[cfg(target_arch = "x86_64")]
const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// A BPF program, kept alive for a child to install.
#[derive(Debug)]
pub(crate) struct Filter {
    program: Vec<sock_filter>,
}

/// Whether this build has a socket filter for the target architecture.
pub(crate) const SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

impl Filter {
    /// The no-network filter, or `None` on an architecture without one.
    pub fn deny_network() -> Option<Filter> {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        {
            let allow = libc::SECCOMP_RET_ALLOW;
            let eacces = libc::SECCOMP_RET_ERRNO | libc::EACCES as u32;
            let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
            let mut p = vec![
                stmt(LD_W_ABS, OFF_ARCH),
                jump(JEQ_K, AUDIT_ARCH, 1, 0),
                stmt(RET_K, libc::SECCOMP_RET_KILL_PROCESS),
                stmt(LD_W_ABS, OFF_NR),
            ];
            #[cfg(target_arch = "x86_64")]
            {
                // x32 syscalls carry this bit and the x86-64 arch value.
                p.push(jump(JGE_K, 0x4000_0000, 0, 1));
                p.push(stmt(RET_K, libc::SECCOMP_RET_KILL_PROCESS));
            }
            p.extend([
                jump(JEQ_K, libc::SYS_io_uring_setup as u32, 0, 1),
                stmt(RET_K, eperm),
                jump(JEQ_K, libc::SYS_socket as u32, 1, 0),
                stmt(RET_K, allow),
                stmt(LD_W_ABS, OFF_ARG0_LOW),
                jump(JEQ_K, libc::AF_UNIX as u32, 0, 1),
                stmt(RET_K, allow),
                stmt(RET_K, eacces),
            ]);
            Some(Filter { program: p })
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            None
        }
    }

    /// A `sock_fprog` pointing into this filter; valid while the filter lives.
    pub fn prog(&self) -> sock_fprog {
        sock_fprog {
            len: self.program.len() as u16,
            filter: self.program.as_ptr() as *mut sock_filter,
        }
    }
}
