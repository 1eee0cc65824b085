//! Raw syscalls returning `-errno` on failure, never touching `errno`: for children that
//! share the host's memory (and so its thread's `errno`) until they exec, and for code that
//! runs between fork and exec.

#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn syscall(n: libc::c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY (for callers): the Linux x86-64 syscall ABI; rcx and r11 are clobbered.
    core::arch::asm!(
        "syscall",
        inlateout("rax") n as isize => ret,
        in("rdi") a[0], in("rsi") a[1], in("rdx") a[2],
        in("r10") a[3], in("r8") a[4], in("r9") a[5],
        lateout("rcx") _, lateout("r11") _,
        options(nostack),
    );
    ret
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub(crate) unsafe fn syscall(n: libc::c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY (for callers): the Linux aarch64 syscall ABI.
    core::arch::asm!(
        "svc 0",
        in("x8") n,
        inlateout("x0") a[0] => ret,
        in("x1") a[1], in("x2") a[2], in("x3") a[3], in("x4") a[4], in("x5") a[5],
        options(nostack),
    );
    ret
}

macro_rules! call {
    ($n:ident) => { call!($n,) };
    ($n:ident, $($a:expr),* $(,)?) => {{
        let mut args = [0usize; 6];
        let given = [$($a as usize),*];
        args[..given.len()].copy_from_slice(&given);
        // SAFETY: see the callers; each passes the arguments its syscall takes.
        unsafe { $crate::sys::raw::syscall(libc::$n, args) }
    }};
}
pub(crate) use call;
