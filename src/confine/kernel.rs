//! What the kernel here offers a confined run, probed once per tool, and what the `required`
//! mode refuses to go without.

use super::options::{IsolationMode, IsolationOptions};
use crate::sys::landlock;
use crate::sys::seccomp;
use crate::sys::spawn::{self, Containment};

/// The kernel's offer, as a tool's plan sees it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Kernel {
    /// The Landlock ABI to use (the kernel's, or less under a test hook).
    pub abi: u32,
    /// How runs are contained.
    pub containment: Containment,
    /// Whether processes a run detaches are killed with it.
    pub orphans_killed: bool,
    /// Whether the host runs as root.
    pub root: bool,
    /// Whether the run is confined at all (mode is not `none`).
    pub confine: bool,
}

impl Kernel {
    /// Probes the kernel for `options`.
    pub fn probe(options: &IsolationOptions) -> Kernel {
        let kernel_abi = landlock::abi();
        let abi = options
            .pretended_abi()
            .map_or(kernel_abi, |p| p.min(kernel_abi));
        let containment = if options.subreaper_forced() {
            Containment::Subreaper
        } else {
            spawn::best_containment()
        };
        Kernel {
            abi,
            containment,
            orphans_killed: containment != Containment::Subreaper || spawn::subreaper_works(),
            root: crate::sys::euid() == 0,
            confine: options.mode != IsolationMode::None,
        }
    }

    /// Landlock applies.
    pub fn landlock_on(&self) -> bool {
        self.confine && self.abi >= 1
    }

    /// Landlock's signal and abstract-socket scopes apply (ABI 6).
    pub fn scopes(&self) -> bool {
        self.landlock_on() && self.abi >= landlock::SCOPE_ABI
    }

    /// The run has a user namespace of its own (an unprivileged host that may make one).
    pub fn own_user_namespace(&self) -> bool {
        self.containment == (Containment::PidNamespace { user_ns: true })
    }

    /// The syscall floor and Landlock's filesystem rules, which `required` needs first.
    ///
    /// # Errors
    /// Which is missing, and what to set instead.
    pub fn check_floor(&self, mode: IsolationMode) -> Result<(), String> {
        if mode != IsolationMode::Required {
            return Ok(());
        }
        if !seccomp::available() {
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
        let abi = self.abi;
        if abi < landlock::MIN_FS_ABI {
            return Err(format!(
                "the kernel offers Landlock ABI {abi} (0: Landlock missing or disabled), and \
                 confining the shell's filesystem needs ABI {} (Linux 6.2, with landlock in the \
                 `lsm=` boot list); set tools.shell.isolation.mode to \"best_effort\" to run with \
                 what the kernel offers, or \"none\" to opt out",
                landlock::MIN_FS_ABI
            ));
        }
        Ok(())
    }

    /// Containment that `required` needs: a run must not be able to outlive its supervisor.
    ///
    /// # Errors
    /// What is missing, and what to set instead.
    pub fn check_containment(&self, mode: IsolationMode) -> Result<(), String> {
        if mode != IsolationMode::Required {
            return Ok(());
        }
        if self.containment == Containment::Subreaper && !self.scopes() {
            return Err(format!(
                "no PID namespace can be made here, and without Landlock's signal scope (ABI {}, \
                 Linux 6.12; this kernel offers ABI {}) a run could kill its supervisor and \
                 leave its processes behind; allow unprivileged user namespaces, or set \
                 tools.shell.isolation.mode to \"best_effort\"",
                landlock::SCOPE_ABI,
                self.abi
            ));
        }
        if !self.orphans_killed {
            return Err(
                "no PID namespace can be made here and /proc/thread-self/children (Linux \
                    CONFIG_PROC_CHILDREN) is missing, so processes a run detaches could \
                    outlive it; allow unprivileged user namespaces, or set \
                    tools.shell.isolation.mode to \"best_effort\""
                    .into(),
            );
        }
        Ok(())
    }
}
