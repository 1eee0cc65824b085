//! What the running kernel offers correx: each feature probed on this machine, for
//! `correx doctor` and for hosts that want to check before they rely on one.

use std::os::fd::AsRawFd;

/// The kernel features correx uses, as probed now.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KernelFeatures {
    /// `uname -r`.
    pub release: String,
    /// `openat2` with `RESOLVE_BENEATH` (Linux 5.6): file tools resolve paths in the kernel;
    /// without it they walk each component with `O_NOFOLLOW`.
    pub openat2: bool,
    /// `pidfd_open` (Linux 5.3): a server's exit is noticed at once instead of by polling.
    pub pidfd: bool,
    /// `close_range` with `CLOSE_RANGE_CLOEXEC` (Linux 5.11): no host descriptor reaches a
    /// child, even one opened without close-on-exec.
    pub close_range: bool,
    /// The Landlock ABI (0: none), which confines the shell's filesystem and network.
    pub landlock_abi: u32,
    /// Whether this build has the seccomp filter that takes the shell's network away.
    pub seccomp_filter: bool,
    /// Seccomp user notification with `SECCOMP_IOCTL_NOTIF_ADDFD` (Linux 5.9), probed with a
    /// listener of a forked child's, and Yama letting a process read its descendants: where no network namespace can be made, a run with a network allowlist
    /// is kept to its proxy by correx making its connects.
    pub seccomp_user_notification: bool,
    /// How the shell's descendants are contained: `pid_namespace`,
    /// `user_and_pid_namespace` or `subreaper`.
    pub containment: &'static str,
}

/// Probes the running kernel (a few syscalls and, once per process, a short-lived child to
/// learn the containment).
pub fn kernel_features() -> KernelFeatures {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let openat2 = crate::sys::open_dir(std::path::Path::new("/"))
        .map(|fd| crate::tools::fs::openat2_supported(fd.as_raw_fd()))
        .unwrap_or(false);
    let pidfd = crate::sys::pidfd_open(std::process::id() as i32).is_some();
    // Closing a descriptor number nothing uses: 0 where the call exists, ENOSYS where not.
    let close_range =
        crate::sys::syscall!(SYS_close_range, 0x7fff_fff0u32, 0x7fff_fff0u32, 0u32).is_ok();
    KernelFeatures {
        release,
        openat2,
        pidfd,
        close_range,
        landlock_abi: crate::sys::landlock::abi(),
        seccomp_filter: crate::sys::seccomp::available(),
        seccomp_user_notification: crate::sys::mediate::available(),
        containment: crate::sys::spawn::best_containment().name(),
    }
}
