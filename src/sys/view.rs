//! A filesystem built for a run: a fresh tmpfs root holding only what the run is granted, each
//! granted path bind-mounted at its own absolute path, the directories leading to it made in
//! the tmpfs (searchable, holding nothing else), then `pivot_root` into it. What is not granted
//! does not exist there.
//!
//! The builder makes raw syscalls only and allocates nothing, so the same code runs on a
//! thread that makes a tool's namespaces, in a run's supervisor (which shares the host's
//! memory), and between fork and exec. Everything it reads is prepared beforehand in a
//! [`ViewPlan`].

use super::raw::call;
use std::ffi::CString;
use std::os::fd::RawFd;

// From <linux/mount.h> (the namespaces' in-place idmapping uses them too).
pub(super) const OPEN_TREE_CLONE: usize = 1;
pub(super) const AT_RECURSIVE: usize = 0x8000;
pub(super) const MOVE_MOUNT_F_EMPTY_PATH: usize = 4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;
pub(super) const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// Most bind mounts one view holds (the builder keeps their descriptors on its stack).
pub(crate) const MAX_BINDS: usize = 48;

/// `struct mount_attr`, for `mount_setattr`.
#[repr(C)]
pub(super) struct MountAttr {
    pub attr_set: u64,
    pub attr_clr: u64,
    pub propagation: u64,
    pub userns_fd: u64,
}

/// How a bound path may be used in the view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Read-only, no set-id, no device files.
    ReadOnly,
    /// Read-write, no set-id, no device files.
    ReadWrite,
    /// A device node (`/dev/null`): usable, nothing executable.
    Device,
}

/// What one entry of the view is.
#[derive(Debug)]
pub(crate) enum What {
    /// A directory of the view itself (a parent of a granted path, `/dev`, `/proc`).
    Dir,
    /// A symlink of the view (`/lib` -> `usr/lib` on a merged-/usr system).
    Symlink { target: CString },
    /// A host path bound here. `idmap` indexes the user namespaces handed to [`build`]: the
    /// mount shows the path's owner as the run's uid.
    Bind {
        source: CString,
        file: bool,
        access: Access,
        idmap: Option<usize>,
    },
}

/// One path of the view, relative to its root (`usr/lib`), in build order (parents first).
#[derive(Debug)]
pub(crate) struct Entry {
    pub rel: CString,
    pub what: What,
}

/// Everything [`build`] needs, prepared beforehand.
#[derive(Debug)]
pub(crate) struct ViewPlan {
    /// A directory that exists where the view is built, on which the new root is mounted
    /// before the pivot (every source is cloned before, so it may be one of them).
    pub stage: CString,
    /// `stage` + `/proc`, where a procfs is mounted during the build.
    pub stage_proc: CString,
    pub entries: Vec<Entry>,
    /// Mount a procfs of the builder's PID namespace at `/proc` during the build (a run's
    /// own view, whose builder is its supervisor: the procfs must be mounted while the
    /// host's is still visible, which the kernel requires in a user namespace).
    pub proc_at_build: bool,
    /// The tmpfs root's mount options.
    pub tmpfs_options: CString,
}

/// Which step of a build failed, for the error: with the entry's index where it is one's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Step {
    Private = 1,
    Clone,
    Attributes,
    Root,
    Create,
    Mount,
    Proc,
    Pivot,
    Seal,
    TooMany,
    Overlay,
}

impl Step {
    /// What the step does, for an error message.
    pub(crate) fn describe(n: u8) -> &'static str {
        match n {
            1 => "making the mounts private",
            2 => "cloning the mount of",
            3 => "setting the mount attributes (read-only, nosuid, idmap) of",
            4 => "mounting the view's tmpfs root",
            5 => "creating in the view",
            6 => "mounting in the view",
            7 => "mounting the run's /proc",
            8 => "pivoting into the view",
            9 => "making the view's root read-only",
            10 => "counting the view's bind mounts",
            11 => "mounting the staged layer over",
            _ => "building the view",
        }
    }
}

/// A failed build: the step, the entry it was at (if any) and the errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Failed {
    pub step: Step,
    pub entry: Option<u16>,
    pub errno: i32,
}

impl Failed {
    /// Packed into a `u32` (step, then entry + 1 in the upper half), for a child's report.
    pub(crate) fn packed(self) -> u32 {
        u32::from(self.step as u8) | (u32::from(self.entry.map_or(0, |e| e + 1)) << 16)
    }

    /// Unpacked: (step, entry).
    pub(crate) fn unpack(n: u32) -> (u8, Option<u16>) {
        let entry = (n >> 16) as u16;
        ((n & 0xff) as u8, entry.checked_sub(1))
    }
}

impl ViewPlan {
    /// The error message for a failed build: the step, the path it was at, the errno.
    pub(crate) fn explain(&self, step: u8, entry: Option<u16>, errno: i32) -> String {
        let at = entry
            .and_then(|i| self.entries.get(usize::from(i)))
            .map(|e| match &e.what {
                What::Bind { source, .. } => format!(" {}", source.to_string_lossy()),
                _ => format!(" /{}", e.rel.to_string_lossy()),
            })
            .unwrap_or_default();
        format!(
            "{}{at}: {}",
            Step::describe(step),
            std::io::Error::from_raw_os_error(errno)
        )
    }
}

fn check(r: isize, step: Step, entry: Option<usize>) -> Result<isize, Failed> {
    if r < 0 {
        Err(Failed {
            step,
            entry: entry.map(|e| e as u16),
            errno: (-r) as i32,
        })
    } else {
        Ok(r)
    }
}

/// Builds `plan`'s view in the caller's mount namespace (a new one, which the caller holds
/// `CAP_SYS_ADMIN` over) and pivots the caller into it. `idmaps` are the user namespaces the
/// entries' `idmap` indexes. With `landlock` (a ruleset and the rights), a rule for the new
/// `/proc` is added to the ruleset once it is mounted. Raw syscalls only: safe between fork
/// and exec.
pub(crate) fn build(
    plan: &ViewPlan,
    idmaps: &[RawFd],
    landlock: Option<(RawFd, u64)>,
) -> Result<(), Failed> {
    let mut trees = [-1 as RawFd; MAX_BINDS];
    let r = clone_and_mount(plan, idmaps, &mut trees, landlock);
    for fd in trees {
        if fd >= 0 {
            call!(SYS_close, fd);
        }
    }
    r
}

fn clone_and_mount(
    plan: &ViewPlan,
    idmaps: &[RawFd],
    trees: &mut [RawFd; MAX_BINDS],
    landlock: Option<(RawFd, u64)>,
) -> Result<(), Failed> {
    // Nothing mounted here propagates back to the host; the host's later mounts beneath a
    // granted path still propagate in.
    check(
        call!(
            SYS_mount,
            c"none".as_ptr(),
            c"/".as_ptr(),
            c"none".as_ptr(),
            libc::MS_REC | libc::MS_SLAVE,
            0usize
        ),
        Step::Private,
        None,
    )?;
    // Every source first, while the host's tree is in sight.
    let mut n = 0;
    for (i, e) in plan.entries.iter().enumerate() {
        let What::Bind {
            source,
            access,
            idmap,
            ..
        } = &e.what
        else {
            continue;
        };
        if n == MAX_BINDS {
            return Err(Failed {
                step: Step::TooMany,
                entry: Some(i as u16),
                errno: libc::E2BIG,
            });
        }
        let fd = check(
            call!(
                SYS_open_tree,
                libc::AT_FDCWD,
                source.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as usize | AT_RECURSIVE
            ),
            Step::Clone,
            Some(i),
        )? as RawFd;
        trees[n] = fd;
        n += 1;
        let userns = match idmap {
            Some(k) => match idmaps.get(*k) {
                Some(fd) => Some(*fd),
                None => {
                    return Err(Failed {
                        step: Step::Attributes,
                        entry: Some(i as u16),
                        errno: libc::EBADF,
                    })
                }
            },
            None => None,
        };
        let attr = MountAttr {
            attr_set: match access {
                Access::ReadOnly => MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                Access::ReadWrite => MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                Access::Device => MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
            } | if userns.is_some() {
                MOUNT_ATTR_IDMAP
            } else {
                0
            },
            attr_clr: 0,
            propagation: 0,
            userns_fd: userns.map_or(0, |u| u as u64),
        };
        check(
            call!(
                SYS_mount_setattr,
                fd,
                c"".as_ptr(),
                libc::AT_EMPTY_PATH as usize | AT_RECURSIVE,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>()
            ),
            Step::Attributes,
            Some(i),
        )?;
    }
    check(
        call!(
            SYS_mount,
            c"tmpfs".as_ptr(),
            plan.stage.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            plan.tmpfs_options.as_ptr()
        ),
        Step::Root,
        None,
    )?;
    let root = check(
        call!(
            SYS_openat,
            libc::AT_FDCWD,
            plan.stage.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC
        ),
        Step::Root,
        None,
    )? as RawFd;
    let r = fill(plan, root, trees, landlock);
    call!(SYS_close, root);
    r
}

/// Creates the entries in the root `root`, mounts the clones, the procfs, and pivots.
fn fill(
    plan: &ViewPlan,
    root: RawFd,
    trees: &[RawFd; MAX_BINDS],
    landlock: Option<(RawFd, u64)>,
) -> Result<(), Failed> {
    let mut n = 0;
    for (i, e) in plan.entries.iter().enumerate() {
        let at = Some(i);
        match &e.what {
            What::Dir => mkdir(root, &e.rel, at)?,
            What::Symlink { target } => {
                let r = call!(SYS_symlinkat, target.as_ptr(), root, e.rel.as_ptr());
                if r != -(libc::EEXIST as isize) {
                    check(r, Step::Create, at)?;
                }
            }
            What::Bind { file, .. } => {
                if *file {
                    // An empty file to mount on (beneath another bind it exists already).
                    let r = call!(
                        SYS_mknodat,
                        root,
                        e.rel.as_ptr(),
                        libc::S_IFREG | 0o644,
                        0usize
                    );
                    if r != -(libc::EEXIST as isize) {
                        check(r, Step::Create, at)?;
                    }
                } else {
                    mkdir(root, &e.rel, at)?;
                }
                check(
                    call!(
                        SYS_move_mount,
                        trees[n],
                        c"".as_ptr(),
                        root,
                        e.rel.as_ptr(),
                        MOVE_MOUNT_F_EMPTY_PATH
                    ),
                    Step::Mount,
                    at,
                )?;
                n += 1;
            }
        }
    }
    if plan.proc_at_build {
        mkdir(root, c"proc", None)?;
        check(mount_proc(&plan.stage_proc), Step::Proc, None)?;
    }
    // pivot_root(".", "."): the old root ends up on top of the new one, and is detached.
    check(call!(SYS_fchdir, root), Step::Pivot, None)?;
    check(
        call!(SYS_pivot_root, c".".as_ptr(), c".".as_ptr()),
        Step::Pivot,
        None,
    )?;
    check(
        call!(SYS_umount2, c".".as_ptr(), libc::MNT_DETACH),
        Step::Pivot,
        None,
    )?;
    check(call!(SYS_chdir, c"/".as_ptr()), Step::Pivot, None)?;
    seal()?;
    if plan.proc_at_build {
        if let Some((ruleset, rights)) = landlock {
            allow_beneath(ruleset, c"/proc", rights)?;
        }
    }
    Ok(())
}

/// The view's own directories become read-only: nothing can be created beside the grants.
fn seal() -> Result<(), Failed> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    check(
        call!(
            SYS_mount_setattr,
            libc::AT_FDCWD,
            c"/".as_ptr(),
            0usize,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>()
        ),
        Step::Seal,
        None,
    )
    .map(drop)
}

/// A procfs: read-only (nothing under `/proc/sys` can be written through it), no set-id, no
/// devices, nothing executable.
const PROC_FLAGS: libc::c_ulong =
    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY;

/// Processes the reader may not ptrace are not listed: a root host's run (another uid, no
/// capabilities) does not see its supervisor, which shares the host's memory (its command
/// line is the host's).
const PROC_OPTIONS: &std::ffi::CStr = c"hidepid=2";

/// A procfs of the caller's PID namespace at `target`, as every run's is mounted.
fn mount_proc(target: &std::ffi::CStr) -> isize {
    call!(
        SYS_mount,
        c"proc".as_ptr(),
        target.as_ptr(),
        c"proc".as_ptr(),
        PROC_FLAGS,
        PROC_OPTIONS.as_ptr()
    )
}

fn mkdir(root: RawFd, rel: &std::ffi::CStr, at: Option<usize>) -> Result<(), Failed> {
    let r = call!(SYS_mkdirat, root, rel.as_ptr(), 0o755);
    // Beneath another bind a directory exists already (and that mount may be read-only).
    if r == -(libc::EEXIST as isize) {
        return Ok(());
    }
    check(r, Step::Create, at).map(drop)
}

/// A staged working directory: an overlay mounted at `target` (the directory's own path in
/// the view) whose lower layer is the directory and whose upper layer collects what the run
/// changes. `data` is the overlay's whole option string, prepared by the host.
/// `rights`: what the run's Landlock ruleset grants beneath it once it is mounted (a rule on
/// the directory itself does not reach into the overlay, another filesystem).
#[derive(Clone, Debug)]
pub(crate) struct Overlay {
    pub target: CString,
    pub data: CString,
    pub rights: u64,
}

/// Mounts each overlay at its target, in the caller's mount namespace (the run's own, with
/// its view in place): the lower layer is what is at the target now. With a Landlock
/// `ruleset` (or -1), each gets its rule. Raw syscalls only.
pub(crate) fn mount_overlays(overlays: &[Overlay], ruleset: RawFd) -> Result<(), Failed> {
    for (i, o) in overlays.iter().enumerate() {
        check(
            call!(
                SYS_mount,
                c"overlay".as_ptr(),
                o.target.as_ptr(),
                c"overlay".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                o.data.as_ptr()
            ),
            Step::Overlay,
            Some(i),
        )?;
        if ruleset >= 0 && o.rights != 0 {
            allow_beneath(ruleset, &o.target, o.rights).map_err(|f| Failed {
                entry: Some(i as u16),
                step: Step::Overlay,
                ..f
            })?;
        }
    }
    Ok(())
}

/// The error message for a failed overlay mount of `overlays`.
pub(crate) fn explain_overlay(overlays: &[Overlay], entry: Option<u16>, errno: i32) -> String {
    let at = entry
        .and_then(|i| overlays.get(usize::from(i)))
        .map(|o| format!(" {}", o.target.to_string_lossy()))
        .unwrap_or_default();
    format!(
        "{}{at}: {}",
        Step::describe(Step::Overlay as u8),
        std::io::Error::from_raw_os_error(errno)
    )
}

/// In a run's own mount namespace over its tool's view (`reuse`, one an earlier run of the
/// tool left, or -1: a new one), entered by a process of the run's PID namespace, then in
/// its start directory `cwd`: a procfs of that PID namespace at `/proc` (only the run's
/// processes), and with `landlock`, the rule that lets the run read it. A staged run's
/// `overlays` are mounted before it enters its start directory. Raw syscalls only.
pub(crate) fn own_proc(
    reuse: RawFd,
    cwd: &std::ffi::CStr,
    landlock: Option<(RawFd, u64)>,
    overlays: &[Overlay],
) -> Result<(), Failed> {
    // A namespace an earlier run of the tool used (its procfs is mounted over), or a new one.
    if reuse >= 0 {
        check(call!(SYS_setns, reuse, libc::CLONE_NEWNS), Step::Proc, None)?;
    } else {
        check(call!(SYS_unshare, libc::CLONE_NEWNS), Step::Proc, None)?;
    }
    // A staged run's layers first: its start directory may lie in one.
    mount_overlays(overlays, landlock.map_or(-1, |(r, _)| r))?;
    // By path: a descriptor of the tool's namespace would lead outside this one's root.
    check(call!(SYS_chdir, cwd.as_ptr()), Step::Proc, None)?;
    check(mount_proc(c"/proc"), Step::Proc, None)?;
    if let Some((ruleset, rights)) = landlock {
        allow_beneath(ruleset, c"/proc", rights)?;
    }
    Ok(())
}

/// Adds `rights` beneath `path` (a filesystem just mounted there: `/proc`, an overlay) to a
/// Landlock ruleset: a rule on what it covers would be on another filesystem.
fn allow_beneath(ruleset: RawFd, path: &std::ffi::CStr, rights: u64) -> Result<(), Failed> {
    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: i32,
    }
    let fd = check(
        call!(
            SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC
        ),
        Step::Proc,
        None,
    )? as RawFd;
    let rule = PathBeneath {
        allowed_access: rights,
        parent_fd: fd,
    };
    const RULE_PATH_BENEATH: usize = 1;
    let r = call!(
        SYS_landlock_add_rule,
        ruleset,
        RULE_PATH_BENEATH,
        &rule as *const PathBeneath,
        0usize
    );
    call!(SYS_close, fd);
    check(r, Step::Proc, None).map(drop)
}

/// Whether the mount API a view is built with (`open_tree`, `move_mount`: Linux 5.2;
/// `mount_setattr`: 5.12) answers here (probed once). Under valgrind, which knows none of it,
/// it does not: runs then walk the host's tree, as where no mount namespace can be made.
pub(crate) fn available() -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORKS.get_or_init(|| {
        // A path descriptor of / (no clone, no privilege), and a call that fails on its bad
        // descriptor where the syscall exists.
        let fd = call!(
            SYS_open_tree,
            libc::AT_FDCWD,
            c"/".as_ptr(),
            libc::O_CLOEXEC as usize
        );
        if fd < 0 {
            return false;
        }
        call!(SYS_close, fd);
        let attr = MountAttr {
            attr_set: 0,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        let r = call!(
            SYS_mount_setattr,
            -1i32,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as usize,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>()
        );
        r != -(libc::ENOSYS as isize)
    })
}

/// Whether a process in a new user, PID and mount namespace of ours may mount a procfs there
/// (probed once). The kernel refuses it where the host's /proc is partly covered by other
/// mounts, as in many containers.
pub(crate) fn proc_in_user_namespace() -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORKS.get_or_init(|| {
        let Ok(maps) = super::spawn::id_maps() else {
            return false;
        };
        let mut pidfd: RawFd = -1;
        let flags =
            libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_PIDFD;
        // SAFETY: clone without CLONE_VM forks this process; the child makes raw syscalls on
        // its own copy of memory prepared before, then _exits.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone,
                flags as libc::c_ulong,
                0usize,
                &mut pidfd as *mut RawFd,
                0usize,
                0usize,
            )
        };
        if pid == 0 {
            let ok = super::child::map_ids(&maps).is_ok()
                && call!(
                    SYS_mount,
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    c"none".as_ptr(),
                    libc::MS_REC | libc::MS_SLAVE,
                    0usize
                ) >= 0
                && mount_proc(c"/proc") >= 0;
            loop {
                call!(SYS_exit_group, if ok { 0 } else { 1 });
            }
        }
        if pid < 0 {
            return false;
        }
        // SAFETY: CLONE_PIDFD stored a new descriptor that nothing else owns.
        let pidfd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) };
        super::spawn::reap(&pidfd) == Some(0)
    })
}

/// The mount namespaces a tool's runs mount their own /proc in, kept for the next runs:
/// destroying one waits for an RCU grace period (about a sixth of a confined spawn here), so
/// each is used by up to [`ProcPool::USES`] runs one after the other, each mounting its procfs
/// over the last one's, and only then let go.
#[derive(Debug, Default)]
pub(crate) struct ProcPool {
    free: parking_lot::Mutex<Vec<(std::os::fd::OwnedFd, u32)>>,
}

impl ProcPool {
    /// Runs one namespace serves before it is let go.
    const USES: u32 = 64;
    /// Namespaces kept at once (as many as runs of a tool go at once, commonly).
    const KEPT: usize = 8;

    /// A namespace a finished run left, and how many runs it served.
    pub fn take(&self) -> Option<(std::os::fd::OwnedFd, u32)> {
        self.free.lock().pop()
    }

    /// Gives back a namespace after a run (every process of it gone); `None`: kept, or it
    /// served its last run and is handed back to be let go.
    pub fn give(&self, ns: std::os::fd::OwnedFd, uses: u32) -> Option<std::os::fd::OwnedFd> {
        let mut free = self.free.lock();
        if uses >= Self::USES || free.len() >= Self::KEPT {
            return Some(ns);
        }
        free.push((ns, uses));
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fd() -> std::os::fd::OwnedFd {
        std::fs::File::open("/dev/null").expect("/dev/null").into()
    }

    #[test]
    fn the_pool_keeps_a_namespace_for_its_runs_and_lets_it_go_after_the_last() {
        let pool = ProcPool::default();
        assert!(pool.take().is_none());
        assert!(pool.give(fd(), 1).is_none(), "kept after one run");
        let (ns, uses) = pool.take().expect("the kept one");
        assert_eq!(uses, 1);
        assert!(
            pool.give(ns, ProcPool::USES).is_some(),
            "let go after its last run"
        );
        // At most KEPT at once; the rest are let go at once.
        for _ in 0..ProcPool::KEPT {
            assert!(pool.give(fd(), 1).is_none());
        }
        assert!(pool.give(fd(), 1).is_some());
    }
}
