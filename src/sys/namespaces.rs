//! Namespaces a confined run joins when the host runs as root, made once per tool and held
//! open by descriptor (joining costs a `setns`; making them per run would cost a mount-table
//! copy and its teardown every time).
//!
//! A root host's run executes as an unprivileged uid (`run_as`), so root-only files stay
//! unreadable to it whatever Landlock allows. Its working directories must still be writable,
//! and what it creates there must belong to the host user: each is bind-mounted onto itself,
//! inside a mount namespace of the tool's, as an **idmapped mount** (Linux 5.12) whose mapping
//! shows the host user's files as the run uid's and stores the run uid's new files as the host
//! user's. The run also gets UTS and IPC namespaces of its own: the host's name and the host's
//! SysV IPC objects and message queues are out of its reach.

use super::syscall;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use super::view::{
    MountAttr, AT_RECURSIVE, MOUNT_ATTR_IDMAP, MOVE_MOUNT_F_EMPTY_PATH, OPEN_TREE_CLONE,
};

/// A user and group id pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ids {
    pub uid: u32,
    pub gid: u32,
}

impl Ids {
    /// This process's effective ids.
    pub fn effective() -> Ids {
        // SAFETY: geteuid and getegid have no preconditions.
        unsafe {
            Ids {
                uid: libc::geteuid(),
                gid: libc::getegid(),
            }
        }
    }
}

/// Mount, UTS and IPC namespaces for a tool's runs, with its paths idmapped inside.
#[derive(Debug)]
pub(crate) struct HeldNamespaces {
    /// `None` when nothing is idmapped: a copy of the host's mount namespace would only make
    /// a start directory opened from the host unreachable by path (`getcwd` fails).
    mnt: Option<OwnedFd>,
    uts: OwnedFd,
    ipc: OwnedFd,
    /// Each idmapped path and an `O_PATH` descriptor of it as the run sees it (through the
    /// idmapped mount), for a run to start in.
    views: Vec<(PathBuf, OwnedFd)>,
}

impl HeldNamespaces {
    /// Makes the namespaces, with every path of `idmapped` (canonical directories) mapped so
    /// that the files of the path's owner there are `run`'s and `run`'s new files are the
    /// owner's (a root host's own directories: root's; a user's project: that user's). Needs
    /// `CAP_SYS_ADMIN` (a root host).
    ///
    /// # Errors
    /// What failed, naming the path: idmapped mounts need Linux 5.12 and a filesystem that
    /// supports them (ext4, xfs, btrfs; tmpfs since 6.3).
    pub fn create(idmapped: &[PathBuf], run: Ids) -> io::Result<HeldNamespaces> {
        Self::create_with(idmapped, run, None)
    }

    /// As [`HeldNamespaces::create`], building `view` (with its owners' mappings to `run`) in
    /// the mount namespace and pivoting it there instead of mapping the paths in place; each
    /// of `idmapped` (the view's writable paths) then gets a descriptor as the run sees it.
    ///
    /// # Errors
    /// As [`HeldNamespaces::create`], or the view's step that failed, naming its path.
    pub fn create_in_view(
        writable: &[PathBuf],
        run: Ids,
        view: &super::view::ViewPlan,
        owners: &[Ids],
    ) -> io::Result<HeldNamespaces> {
        Self::create_with(writable, run, Some((view, owners)))
    }

    fn create_with(
        idmapped: &[PathBuf],
        run: Ids,
        view: Option<(&super::view::ViewPlan, &[Ids])>,
    ) -> io::Result<HeldNamespaces> {
        if let Some((plan, owners)) = view {
            return in_view(idmapped, run, plan, owners);
        }
        use std::os::unix::fs::MetadataExt;
        // Parents first, and nothing beneath a path already mapped (it is mapped with it).
        let mut paths: Vec<PathBuf> = idmapped.to_vec();
        paths.sort_by_key(|p| p.as_os_str().len());
        let mut mapped: Vec<PathBuf> = Vec::new();
        for p in paths {
            if !mapped.iter().any(|m| p.starts_with(m)) {
                mapped.push(p);
            }
        }
        // One mapping per owner: each path's owner becomes the run's ids through its mount.
        let mut owners: Vec<(Ids, OwnedFd)> = Vec::new();
        let mut jobs: Vec<(PathBuf, RawFd)> = Vec::new();
        for p in mapped {
            let m = std::fs::metadata(&p)?;
            let owner = Ids {
                uid: m.uid(),
                gid: m.gid(),
            };
            let fd = match owners.iter().find(|(o, _)| *o == owner) {
                Some((_, fd)) => fd.as_raw_fd(),
                None => {
                    let ns = idmap_userns(owner, run).map_err(|e| {
                        io::Error::new(
                            e.kind(),
                            format!("making the user namespace of the id mapping: {e}"),
                        )
                    })?;
                    let raw = ns.as_raw_fd();
                    owners.push((owner, ns));
                    raw
                }
            };
            jobs.push((p, fd));
        }
        // unshare(CLONE_NEWNS) is refused to a process with threads unless only the calling
        // thread moves: a thread of its own does the work and leaves the namespaces behind.
        let made = std::thread::Builder::new()
            .name("correx-ns".into())
            .spawn(move || make_in_this_thread(&jobs))?
            .join()
            .map_err(|_| io::Error::other("the namespace thread panicked"))??;
        drop(owners);
        let (mnt, uts, ipc, views) = made;
        // Every path asked for has a view: the mapped one itself, or beneath it.
        let mut all = Vec::new();
        for p in idmapped {
            let (base, fd) = views
                .iter()
                .find(|(m, _)| p.starts_with(m))
                .ok_or_else(|| io::Error::other(format!("{} was not mapped", p.display())))?;
            let rest = p.strip_prefix(base).unwrap_or(Path::new(""));
            let fd = if rest.as_os_str().is_empty() {
                fd.try_clone()?
            } else {
                open_path(fd.as_raw_fd(), rest)?
            };
            all.push((p.clone(), fd));
        }
        Ok(HeldNamespaces {
            mnt,
            uts,
            ipc,
            views: all,
        })
    }

    /// The namespace descriptors a run's process joins (`setns`), mount namespace first.
    pub fn fds(&self) -> [RawFd; 3] {
        [
            self.mnt.as_ref().map_or(-1, |m| m.as_raw_fd()),
            self.uts.as_raw_fd(),
            self.ipc.as_raw_fd(),
        ]
    }

    /// Copies of the namespace descriptors (mount, UTS, IPC), for a thread to join them.
    pub fn clone_fds(&self) -> io::Result<Vec<OwnedFd>> {
        let mut fds = Vec::with_capacity(3);
        if let Some(m) = &self.mnt {
            fds.push(m.try_clone()?);
        }
        fds.push(self.uts.try_clone()?);
        fds.push(self.ipc.try_clone()?);
        Ok(fds)
    }

    /// Whether every view is still the directory at its path (a directory removed and made
    /// again on the host is another one, which the run's namespace does not show): `Err`
    /// names the first that is not.
    pub fn check_views(&self) -> Result<(), PathBuf> {
        use std::os::unix::fs::MetadataExt;
        for (p, fd) in &self.views {
            let view = std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()));
            let host = std::fs::metadata(p);
            match (view, host) {
                (Ok(v), Ok(h)) if v.dev() == h.dev() && v.ino() == h.ino() => {}
                _ => return Err(p.clone()),
            }
        }
        Ok(())
    }

    /// The run's view of `path` (one of the idmapped paths), an `O_PATH` directory.
    pub fn view(&self, path: &Path) -> Option<&OwnedFd> {
        self.views.iter().find(|(p, _)| p == path).map(|(_, fd)| fd)
    }
}

/// The namespaces of [`HeldNamespaces::create_in_view`]: the view built on a thread of its
/// own, which then opens each of `writable` through it.
fn in_view(
    writable: &[PathBuf],
    run: Ids,
    plan: &super::view::ViewPlan,
    owners: &[Ids],
) -> io::Result<HeldNamespaces> {
    let mut maps = Vec::with_capacity(owners.len());
    for owner in owners {
        maps.push(idmap_userns(*owner, run).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("making the user namespace of the id mapping: {e}"),
            )
        })?);
    }
    let fds: Vec<RawFd> = maps.iter().map(|m| m.as_raw_fd()).collect();
    let made = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("correx-view".into())
            .spawn_scoped(scope, || -> io::Result<Made> {
                let ns = |name: &str| open_ns(&format!("/proc/thread-self/ns/{name}"));
                syscall!(
                    SYS_unshare,
                    libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC
                )
                .map_err(|e| io::Error::new(e.kind(), format!("unshare: {e}")))?;
                // Named through /proc, which the view does not hold.
                let held = (ns("mnt")?, ns("uts")?, ns("ipc")?);
                super::view::build(plan, &fds, None).map_err(|f| {
                    io::Error::new(
                        io::Error::from_raw_os_error(f.errno).kind(),
                        plan.explain(f.step as u8, f.entry, f.errno),
                    )
                })?;
                let mut views = Vec::with_capacity(writable.len());
                for p in writable {
                    let view = open_path(libc::AT_FDCWD, p).map_err(|e| {
                        io::Error::new(
                            e.kind(),
                            format!("opening {} in the view: {e}", p.display()),
                        )
                    })?;
                    views.push((p.clone(), view));
                }
                Ok((Some(held.0), held.1, held.2, views))
            })?
            .join()
            .map_err(|_| io::Error::other("the view's thread panicked"))?
    })?;
    drop(maps);
    let (mnt, uts, ipc, views) = made;
    Ok(HeldNamespaces {
        mnt,
        uts,
        ipc,
        views,
    })
}

type Made = (Option<OwnedFd>, OwnedFd, OwnedFd, Vec<(PathBuf, OwnedFd)>);

fn make_in_this_thread(paths: &[(PathBuf, RawFd)]) -> io::Result<Made> {
    let ns = |name: &str| open_ns(&format!("/proc/thread-self/ns/{name}"));
    if paths.is_empty() {
        syscall!(SYS_unshare, libc::CLONE_NEWUTS | libc::CLONE_NEWIPC)
            .map_err(|e| io::Error::new(e.kind(), format!("unshare: {e}")))?;
        return Ok((None, ns("uts")?, ns("ipc")?, Vec::new()));
    }
    syscall!(
        SYS_unshare,
        libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC
    )
    .map_err(|e| io::Error::new(e.kind(), format!("unshare: {e}")))?;
    // Nothing mounted in here propagates back to the host; the host's later mounts still
    // propagate in.
    syscall!(
        SYS_mount,
        c"none".as_ptr(),
        c"/".as_ptr(),
        c"none".as_ptr(),
        (libc::MS_REC | libc::MS_SLAVE) as libc::c_ulong,
        std::ptr::null::<libc::c_void>()
    )
    .map_err(|e| io::Error::new(e.kind(), format!("making the mounts private: {e}")))?;
    let mut views = Vec::new();
    for (p, userns_fd) in paths {
        let what = |step: &str, e: io::Error| {
            io::Error::new(e.kind(), format!("{step} of {}: {e}", p.display()))
        };
        let c = super::fs::cstr(p.as_os_str())?;
        let tree = syscall!(
            SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            (OPEN_TREE_CLONE | AT_RECURSIVE) as u32 | libc::O_CLOEXEC as u32
        )
        .map_err(|e| what("cloning the mount", e))?;
        // SAFETY: a new descriptor nothing else owns.
        let tree = unsafe { OwnedFd::from_raw_fd(tree as RawFd) };
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_IDMAP,
            attr_clr: 0,
            propagation: 0,
            userns_fd: *userns_fd as u64,
        };
        syscall!(
            SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH as u32) | AT_RECURSIVE as u32,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>()
        )
        .map_err(|e| what("the idmapped mount (its filesystem may not support one)", e))?;
        syscall!(
            SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH as u32
        )
        .map_err(|e| what("mounting", e))?;
        let view = open_path(libc::AT_FDCWD, p).map_err(|e| what("opening", e))?;
        views.push((p.clone(), view));
    }
    Ok((Some(ns("mnt")?), ns("uts")?, ns("ipc")?, views))
}

/// An `O_PATH` descriptor of `p` (relative to `dir`), following symlinks.
fn open_path(dir: RawFd, p: &Path) -> io::Result<OwnedFd> {
    super::fs::openat(dir, p.as_os_str(), libc::O_PATH, 0)
}

/// A namespace descriptor (`setns` and `mount_setattr` refuse `O_PATH` ones).
fn open_ns(path: &str) -> io::Result<OwnedFd> {
    Ok(OwnedFd::from(std::fs::File::open(path)?))
}

/// A user namespace whose only mapping is `host` (inside) to `run` (outside): as an idmapped
/// mount's mapping it shows files of `host` as `run`'s. A child made for the purpose holds it
/// while the maps are written, then exits; the descriptor keeps it.
fn idmap_userns(host: Ids, run: Ids) -> io::Result<OwnedFd> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the array on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are new descriptors owned by nothing else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut pidfd: RawFd = -1;
    // SAFETY: clone without CLONE_VM forks this process; the child only reads the pipe (until
    // we close it) and exits: async-signal-safe calls on memory of its own copy.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::CLONE_PIDFD) as libc::c_ulong,
            0usize,
            &mut pidfd as *mut RawFd,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        let mut b = [0u8; 1];
        let r = r.as_raw_fd() as libc::c_uint;
        // SAFETY: in the forked child: closing every descriptor but the read end (its copy of
        // our write end, and those of other threads' children, so our close is an end of
        // file), a read into a local buffer, then _exit.
        unsafe {
            libc::syscall(libc::SYS_close_range, 3u32, r - 1, 0u32);
            libc::syscall(libc::SYS_close_range, r + 1, u32::MAX, 0u32);
            libc::read(r as libc::c_int, b.as_mut_ptr().cast(), 1);
            libc::_exit(0)
        }
    }
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CLONE_PIDFD stored a new descriptor that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop(r);
    let result = (|| {
        let write = |name: &str, line: String| {
            std::fs::write(format!("/proc/{pid}/{name}"), line)
                .map_err(|e| io::Error::new(e.kind(), format!("writing {name}: {e}")))
        };
        write("uid_map", format!("{} {} 1\n", host.uid, run.uid))?;
        write("gid_map", format!("{} {} 1\n", host.gid, run.gid))?;
        open_ns(&format!("/proc/{pid}/ns/user"))
    })();
    drop(w);
    super::spawn::reap(&pidfd);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_host_maps_a_directory_for_an_unprivileged_uid() {
        if Ids::effective().uid != 0 {
            eprintln!("!!! not root: idmapped mounts are for root hosts !!!");
            return;
        }
        let dir = std::env::temp_dir().join(format!("correx-ns-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dir = std::fs::canonicalize(&dir).unwrap();
        let run = Ids {
            uid: 65534,
            gid: 65534,
        };
        let held = HeldNamespaces::create(std::slice::from_ref(&dir), run).unwrap();
        // Through the run's view the root-owned directory is the run uid's.
        let view = held.view(&dir).unwrap();
        let st = std::fs::metadata(format!("/proc/self/fd/{}", view.as_raw_fd())).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((st.uid(), st.gid()), (65534, 65534));
        // The host's own view is unchanged.
        assert_eq!(std::fs::metadata(&dir).unwrap().uid(), 0);
        assert_eq!(held.check_views(), Ok(()));
        // A directory removed and made again is not the one the view shows.
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(held.check_views(), Err(dir.clone()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
