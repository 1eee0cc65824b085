//! The filesystem layer of a tool's plan: Landlock's rules (read and execute the system
//! directories, the executables' directories and `read_paths`; read and write the working
//! dirs; the device files), opened once for every run.

use super::applied::Filesystem;
use super::kernel::Kernel;
use super::options::IsolationOptions;
use super::view::{self, Planned, Proc};
use crate::sys::landlock::{self, Access, FsRule, OpenedRules};
use std::path::{Path, PathBuf};

/// System directories a normal program needs to read and execute from.
const SYSTEM_READ: &[&str] = &[
    "/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc",
];
/// Device files a normal program writes to or reads from.
const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"];

/// What a tool's runs may read and write.
pub(super) struct Grants {
    read: Vec<PathBuf>,
    write: Vec<PathBuf>,
}

/// The grants for `options`: the system directories, then the executables' directories and
/// the read paths (each once); the working dirs to write.
pub(super) fn grants(
    options: &IsolationOptions,
    working_dirs: &[PathBuf],
    executable_dirs: &[PathBuf],
) -> Grants {
    let mut read: Vec<PathBuf> = SYSTEM_READ.iter().map(PathBuf::from).collect();
    for d in executable_dirs.iter().chain(&options.read_paths) {
        if !read.contains(d) {
            read.push(d.clone());
        }
    }
    Grants {
        read,
        write: working_dirs.to_vec(),
    }
}

impl Grants {
    /// The view of these grants (and of `tmp_base`, writable), built on `tmp_base`; with
    /// `idmap` the writable paths show their owners' files as the run's, except `staging`
    /// (the staged layers' directory, which an overlay mounted by the host writes as it is).
    ///
    /// # Errors
    /// Why no view can hold these grants.
    pub fn view(
        &self,
        idmap: bool,
        proc: Proc,
        tmp_base: &Path,
        staging: Option<&Path>,
    ) -> Result<Planned, String> {
        let devices: Vec<PathBuf> = DEVICES.iter().map(PathBuf::from).collect();
        let mut write = self.write.clone();
        write.push(tmp_base.to_path_buf());
        view::plan(&view::Spec {
            system: SYSTEM_READ,
            read: &self.read[SYSTEM_READ.len()..],
            write: &write,
            devices: &devices,
            idmap,
            unmapped: staging.filter(|_| idmap),
            proc,
            stage: tmp_base,
        })
    }

    /// The rules opened (each path once, now), where Landlock applies.
    ///
    /// # Errors
    /// A rule's path could not be opened.
    pub fn open(&self, kernel: &Kernel) -> Result<Option<OpenedRules>, String> {
        if !kernel.landlock_on() {
            return Ok(None);
        }
        let rules: Vec<FsRule> = landlock::rules_for(&self.read, Access::ReadExec)
            .chain(landlock::rules_for(DEVICES, Access::DeviceReadWrite))
            .chain(landlock::rules_for(&self.write, Access::ReadWrite))
            .collect();
        landlock::open_rules(kernel.abi, &rules)
            .map(Some)
            .map_err(|e| format!("opening Landlock rule paths: {e}"))
    }

    /// The rules as applied, for the record; `None` without Landlock.
    pub fn applied(&self, kernel: &Kernel) -> Option<Filesystem> {
        let shown = |paths: &[PathBuf]| paths.iter().map(|p| p.display().to_string()).collect();
        kernel.landlock_on().then(|| Filesystem {
            read_exec: shown(&self.read),
            devices: DEVICES,
            read_write: shown(&self.write),
            private_tmp: true,
            truncate_handled: kernel.abi >= 3,
        })
    }
}
