//! A seccomp filter, assembled by hand, that leaves a child no network: `socket` with any family
//! but `AF_UNIX` fails with `EACCES`, and so do `connect` and `sendto` with an address (so the
//! UNIX sockets it may make reach nothing outside the run: only `socketpair` and sockets it
//! binds itself work); `io_uring_setup` (which can open sockets on its own) fails with `EPERM`;
//! a syscall from another ABI (i386 or x32 on x86-64) kills the process, since its numbers
//! would bypass the checks.

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
#[cfg(target_endian = "little")]
const OFF_ARG4_LOW: u32 = 16 + 4 * 8;
#[cfg(target_endian = "little")]
const OFF_ARG4_HIGH: u32 = 16 + 4 * 8 + 4;

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
            // Offsets are to the final ALLOW (i11) and DENY (i12) below.
            p.extend([
                /* i0 */ jump(JEQ_K, libc::SYS_io_uring_setup as u32, 0, 1),
                /* i1 */ stmt(RET_K, eperm),
                // connect: pathname and abstract UNIX sockets reach daemons outside the run
                // (a user's D-Bus, a Docker socket); socketpair needs no connect.
                /* i2 */
                jump(JEQ_K, libc::SYS_connect as u32, 9, 0),
                // sendto with a destination address: the same, for datagram sockets.
                /* i3 */
                jump(JEQ_K, libc::SYS_sendto as u32, 0, 4),
                /* i4 */ stmt(LD_W_ABS, OFF_ARG4_LOW),
                /* i5 */ jump(JEQ_K, 0, 0, 6),
                /* i6 */ stmt(LD_W_ABS, OFF_ARG4_HIGH),
                /* i7 */ jump(JEQ_K, 0, 3, 4),
                /* i8 */ jump(JEQ_K, libc::SYS_socket as u32, 0, 2),
                /* i9 */ stmt(LD_W_ABS, OFF_ARG0_LOW),
                /* i10 */ jump(JEQ_K, libc::AF_UNIX as u32, 0, 1),
                /* i11 */ stmt(RET_K, allow),
                /* i12 */ stmt(RET_K, eacces),
            ]);
            Some(Filter { program: p })
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            None
        }
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
