//! Cgroups with `pids.max`: the process bound where `RLIMIT_NPROC` does not apply (root, whose
//! processes the kernel never counts against it). Used only where this process may create
//! cgroups: a cgroup v1 `pids` hierarchy, or a cgroup v2 hierarchy whose parent enables the
//! `pids` controller.
//!
//! Moving a process into a cgroup is slow (a few hundred µs: the kernel waits for an RCU grace
//! period), so on v1, where a single thread may sit in a cgroup of its own, a tool gets one
//! cgroup and a spawner thread inside it: every supervisor is cloned from that thread and so is
//! born in the cgroup. On v2 (no per-thread placement for this controller) each run joins a
//! cgroup of its own.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use super::spawner::{Prepare, Spawner};

/// A directory this process can create `pids` cgroups in, and whether it is cgroup v1.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PidsParent {
    pub dir: &'static Path,
    pub v1: bool,
}

/// The cgroup directory this process can create `pids` cgroups in, probed once.
pub(crate) fn pids_parent() -> Option<PidsParent> {
    static PARENT: OnceLock<Option<(PathBuf, bool)>> = OnceLock::new();
    PARENT
        .get_or_init(|| {
            candidates()
                .into_iter()
                .find(|(dir, _)| RunCgroup::new(dir, 1).is_ok())
        })
        .as_ref()
        .map(|(dir, v1)| PidsParent { dir, v1: *v1 })
}

/// Where a `pids` cgroup could go: our own cgroup in a v1 `pids` hierarchy, and the v2 cgroup
/// we are in (or the v2 root) when it enables the `pids` controller for its children.
fn candidates() -> Vec<(PathBuf, bool)> {
    let (Ok(mounts), Ok(own)) = (
        std::fs::read_to_string("/proc/self/mountinfo"),
        std::fs::read_to_string("/proc/self/cgroup"),
    ) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in mounts.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = left.split(' ').nth(4) else {
            continue;
        };
        let mut r = right.split(' ');
        let (fstype, _source, options) = (r.next(), r.next(), r.next().unwrap_or(""));
        let relative = |controllers: &dyn Fn(&str) -> bool| {
            own.lines().find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, c, path) = (f.next()?, f.next()?, f.next()?);
                controllers(c).then(|| path.trim_start_matches('/').to_owned())
            })
        };
        match fstype {
            Some("cgroup") if options.split(',').any(|o| o == "pids") => {
                if let Some(rel) = relative(&|c| c.split(',').any(|x| x == "pids")) {
                    out.push((Path::new(mount_point).join(rel), true));
                }
            }
            Some("cgroup2") => {
                let root = PathBuf::from(mount_point);
                if let Some(rel) = relative(&|c| c.is_empty()) {
                    out.push((root.join(rel), false));
                }
                out.push((root, false));
            }
            _ => {}
        }
    }
    out.retain(|(d, _)| {
        // v2 only offers pids.max in children when the parent enables the controller.
        let control = d.join("cgroup.subtree_control");
        !control.exists()
            || std::fs::read_to_string(&control)
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "pids"))
    });
    out
}

/// One run's cgroup, removed on drop (after every process in it is gone).
#[derive(Debug)]
pub(crate) struct RunCgroup {
    dir: PathBuf,
    procs: CString,
}

impl RunCgroup {
    /// Creates `parent/correx-{pid}-{n}` with `pids.max` = `limit`.
    pub fn new(parent: &Path, limit: u64) -> io::Result<RunCgroup> {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = loop {
            let dir = parent.join(format!(
                "correx-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            match std::fs::create_dir(&dir) {
                Ok(()) => break dir,
                // A process killed before it removed its cgroups left this one, and its pid is
                // ours now: gone if empty, passed over if something still runs in it.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let _ = std::fs::remove_dir(&dir);
                }
                Err(e) => return Err(e),
            }
        };
        let cg = RunCgroup {
            procs: CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in cgroup path"))?,
            dir,
        };
        std::fs::write(cg.dir.join("pids.max"), limit.to_string())?;
        Ok(cg)
    }

    /// Whether no process is in the cgroup (so the next run may use it).
    pub fn is_empty(&self) -> bool {
        std::fs::read(self.dir.join("cgroup.procs")).is_ok_and(|c| c.is_empty())
    }

    /// The `cgroup.procs` file a process writes `0` to, to join.
    pub fn procs(&self) -> &std::ffi::CStr {
        &self.procs
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        // The last processes may still be leaving the cgroup for a moment after they were
        // reaped.
        for _ in 0..100 {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(e) => {
                    log::warn!("removing {}: {e}", self.dir.display());
                    return;
                }
            }
        }
        log::warn!("{} still busy; left behind", self.dir.display());
    }
}

/// A tool's cgroup (v1) with its spawner thread; every run of the tool is born in it, so
/// `pids.max` bounds the tool's runs together (a run alone gets all of it).
#[derive(Debug)]
pub(crate) struct ToolCgroup {
    // Fields drop in order: the thread leaves the cgroup by exiting, then the (empty) cgroup
    // can go.
    spawner: Spawner,
    _dir: RunCgroup,
}

impl ToolCgroup {
    /// A cgroup under `parent` for `limit` processes (plus the spawner thread itself), whose
    /// spawner thread joins it and then runs `prepare`.
    pub fn new(parent: &Path, limit: u64, prepare: Prepare) -> io::Result<ToolCgroup> {
        let dir = RunCgroup::new(parent, limit.saturating_add(1))?;
        let tasks = dir.dir.join("tasks");
        let spawner = Spawner::start(Box::new(move || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            std::fs::write(&tasks, tid.to_string())?;
            prepare()
        }))?;
        Ok(ToolCgroup { spawner, _dir: dir })
    }

    /// The thread to clone supervisors from.
    pub fn spawner(&self) -> &Spawner {
        &self.spawner
    }
}
