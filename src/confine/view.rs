//! The view layer of a plan: the filesystem a run sees, as the mounts that make it (in build
//! order), from what the filesystem layer grants. Each granted path is bound at its own
//! absolute path; the directories leading to it are the view's own, holding nothing else;
//! a system directory that is a symlink on the host (`/lib` -> `usr/lib`) is the same symlink.

use super::applied::ViewMount;
use crate::sys::namespaces::Ids;
use crate::sys::view::{Access, Entry, ViewPlan, What, MAX_BINDS};
use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Where a run's `/proc` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Proc {
    /// None: the run has no PID namespace, and the host's would show every process.
    None,
    /// Mounted while the view is built, by the run's supervisor (a view per run).
    AtBuild,
    /// Mounted by each run in a mount namespace of its own, over the tool's view.
    PerRun,
}

/// What goes into a view.
pub(crate) struct Spec<'a> {
    /// Read (and execute): system directories may be symlinks, kept as such.
    pub system: &'a [&'a str],
    /// Read (and execute), bound at their canonical paths (with a symlink at the path given
    /// where that differs).
    pub read: &'a [PathBuf],
    /// Read and write (idmapped for the run with `idmap`).
    pub write: &'a [PathBuf],
    /// Device files (or directories of them), bound one by one into the view's `/dev`.
    pub devices: &'a [PathBuf],
    /// On a root host whose runs execute as another uid: the writable paths show their
    /// owner's files as the run's.
    pub idmap: bool,
    /// A writable path bound as it is on disk even with `idmap` (beneath an idmapped one).
    pub unmapped: Option<&'a Path>,
    pub proc: Proc,
    /// An existing directory the view's root is mounted on while it is built.
    pub stage: &'a Path,
}

/// A view planned: the builder's plan, the owners its idmapped mounts map, the record.
#[derive(Debug)]
pub(crate) struct Planned {
    pub plan: ViewPlan,
    /// The owners whose files each idmapped mount shows as the run's (`idmap` indexes this).
    pub owners: Vec<Ids>,
    pub record: Vec<ViewMount>,
}

#[derive(Debug)]
enum Item {
    Bind {
        source: PathBuf,
        file: bool,
        access: Access,
        owner: Option<Ids>,
    },
    Symlink(PathBuf),
}

/// Plans the view of `spec`.
///
/// # Errors
/// A grant that leaves nothing to hide (`/` itself), more bind mounts than a view holds, or
/// a path that cannot be named to the kernel (a NUL byte).
pub(crate) fn plan(spec: &Spec<'_>) -> Result<Planned, String> {
    if !crate::sys::view::available() {
        return Err(
            "the kernel does not answer the mount API a view is built with (open_tree, \
             move_mount, mount_setattr: Linux 5.12), or something between (valgrind) hides it"
                .into(),
        );
    }
    let mut items: Vec<(PathBuf, Item)> = Vec::new();
    for s in spec.system {
        let p = Path::new(s);
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(p) {
                    items.push((p.to_path_buf(), Item::Symlink(target)));
                }
                if let Ok(c) = std::fs::canonicalize(p) {
                    items.push(read_only(c));
                }
            }
            Ok(_) => items.push(read_only(p.to_path_buf())),
            Err(_) => {}
        }
    }
    for p in spec.read {
        let Ok(c) = std::fs::canonicalize(p) else {
            continue; // not here: nothing to see
        };
        if c != *p && p.is_absolute() {
            items.push((p.clone(), Item::Symlink(c.clone())));
        }
        items.push(read_only(c));
    }
    for p in spec.write {
        let Ok(c) = std::fs::canonicalize(p) else {
            continue;
        };
        let owner = if spec.idmap {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(&c).map_err(|e| format!("{}: {e}", c.display()))?;
            Some(Ids {
                uid: m.uid(),
                gid: m.gid(),
            })
        } else {
            None
        };
        items.push((
            c.clone(),
            Item::Bind {
                file: !c.is_dir(),
                source: c,
                access: Access::ReadWrite,
                owner,
            },
        ));
    }
    if let Some(p) = spec.unmapped {
        items.push((
            p.to_path_buf(),
            Item::Bind {
                file: false,
                source: p.to_path_buf(),
                access: Access::ReadWrite,
                owner: None,
            },
        ));
    }
    for p in spec.devices {
        if p.exists() {
            items.push((
                p.clone(),
                Item::Bind {
                    file: !p.is_dir(),
                    source: p.clone(),
                    access: Access::Device,
                    owner: None,
                },
            ));
        }
    }
    if spec.proc != Proc::None {
        for (name, target) in [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ] {
            items.push((
                Path::new("/dev").join(name),
                Item::Symlink(PathBuf::from(target)),
            ));
        }
    }
    if let Some((p, _)) = items.iter().find(|(p, _)| p.parent().is_none()) {
        return Err(format!(
            "{} is granted whole: a view would hide nothing",
            p.display()
        ));
    }
    // Parents first; at one path a writable bind before a read-only one (which it covers).
    items.sort_by(|(a, x), (b, y)| a.cmp(b).then_with(|| rank(x).cmp(&rank(y))));
    lay_out(spec, items)
}

fn read_only(p: PathBuf) -> (PathBuf, Item) {
    (
        p.clone(),
        Item::Bind {
            file: !p.is_dir(),
            source: p,
            access: Access::ReadOnly,
            owner: None,
        },
    )
}

fn rank(i: &Item) -> u8 {
    match i {
        Item::Bind {
            access: Access::ReadWrite,
            ..
        } => 0,
        Item::Bind { .. } => 1,
        Item::Symlink(_) => 2,
    }
}

/// The sorted items as the builder's entries: each once, with the view's directories that
/// lead to it; a path beneath a bind of the same kind is in that bind already.
fn lay_out(spec: &Spec<'_>, items: Vec<(PathBuf, Item)>) -> Result<Planned, String> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut record: Vec<ViewMount> = Vec::new();
    let mut owners: Vec<Ids> = Vec::new();
    let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
    let mut links: BTreeSet<PathBuf> = BTreeSet::new();
    let mut binds: Vec<(PathBuf, Access, Option<Ids>)> = Vec::new();
    let mut count = 0;
    for (at, item) in items {
        let beneath = binds
            .iter()
            .filter(|(b, _, _)| at.starts_with(b))
            .max_by_key(|(b, _, _)| b.as_os_str().len())
            .cloned();
        if links.iter().any(|l| at.starts_with(l)) {
            continue; // beneath a symlink of the view
        }
        match item {
            Item::Symlink(target) => {
                if beneath.is_some() {
                    continue; // the host's own entry is there
                }
                parents(&at, &mut dirs, &mut entries, &binds)?;
                record.push(ViewMount {
                    path: at.display().to_string(),
                    from: None,
                    access: "symlink",
                    target: Some(target.display().to_string()),
                });
                entries.push(Entry {
                    rel: rel(&at)?,
                    what: What::Symlink {
                        target: cstring(target.as_os_str().as_bytes())?,
                    },
                });
                links.insert(at);
            }
            Item::Bind {
                source,
                file,
                access,
                owner,
            } => {
                if let Some((_, a, o)) = &beneath {
                    if *a == access && *o == owner {
                        continue;
                    }
                } else {
                    parents(&at, &mut dirs, &mut entries, &binds)?;
                }
                count += 1;
                if count > MAX_BINDS {
                    return Err(format!(
                        "more than {MAX_BINDS} paths to bind into the view; grant fewer, broader \
                         read_paths"
                    ));
                }
                let idmap = owner.map(|o| match owners.iter().position(|x| *x == o) {
                    Some(i) => i,
                    None => {
                        owners.push(o);
                        owners.len() - 1
                    }
                });
                record.push(ViewMount {
                    path: at.display().to_string(),
                    from: Some(source.display().to_string()),
                    access: match access {
                        Access::ReadOnly => "read_only",
                        Access::ReadWrite => "read_write",
                        Access::Device => "device",
                    },
                    target: None,
                });
                entries.push(Entry {
                    rel: rel(&at)?,
                    what: What::Bind {
                        source: cstring(source.as_os_str().as_bytes())?,
                        file,
                        access,
                        idmap,
                    },
                });
                binds.push((at, access, owner));
            }
        }
    }
    if spec.proc == Proc::PerRun {
        entries.push(Entry {
            rel: cstring(b"proc")?,
            what: What::Dir,
        });
    }
    let stage = cstring(spec.stage.as_os_str().as_bytes())?;
    let stage_proc = cstring(spec.stage.join("proc").as_os_str().as_bytes())?;
    Ok(Planned {
        plan: ViewPlan {
            stage,
            stage_proc,
            entries,
            proc_at_build: spec.proc == Proc::AtBuild,
            tmpfs_options: cstring(b"mode=0755,size=64k,nr_inodes=4096")?,
        },
        owners,
        record,
    })
}

/// The view's directories leading to `at` that are not there yet, as entries (none beneath a
/// bind: those are the host's).
fn parents(
    at: &Path,
    dirs: &mut BTreeSet<PathBuf>,
    entries: &mut Vec<Entry>,
    binds: &[(PathBuf, Access, Option<Ids>)],
) -> Result<(), String> {
    let mut p = PathBuf::from("/");
    let comps: Vec<Component<'_>> = at.components().collect();
    for c in comps.iter().take(comps.len().saturating_sub(1)) {
        if matches!(c, Component::RootDir) {
            continue;
        }
        p.push(c);
        if binds.iter().any(|(b, _, _)| p.starts_with(b)) {
            return Ok(());
        }
        if dirs.insert(p.clone()) {
            entries.push(Entry {
                rel: rel(&p)?,
                what: What::Dir,
            });
        }
    }
    Ok(())
}

/// `at` relative to the root (`/usr/lib` -> `usr/lib`).
fn rel(at: &Path) -> Result<CString, String> {
    let r = at.strip_prefix("/").unwrap_or(at);
    cstring(r.as_os_str().as_bytes())
}

fn cstring(b: &[u8]) -> Result<CString, String> {
    CString::new(b).map_err(|_| {
        format!(
            "{} holds a NUL byte",
            String::from_utf8_lossy(b).replace('\0', "\\0")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rels(p: &Planned) -> Vec<String> {
        p.plan
            .entries
            .iter()
            .map(|e| {
                let kind = match &e.what {
                    What::Dir => "dir",
                    What::Symlink { .. } => "link",
                    What::Bind {
                        access: Access::ReadWrite,
                        ..
                    } => "rw",
                    What::Bind {
                        access: Access::Device,
                        ..
                    } => "dev",
                    What::Bind { .. } => "ro",
                };
                format!("{kind} {}", e.rel.to_string_lossy())
            })
            .collect()
    }

    #[test]
    fn parents_are_the_views_own_and_what_a_bind_covers_is_not_bound_again() {
        let base = std::env::temp_dir().join(format!("correx-view-plan-{}", std::process::id()));
        let work = base.join("a/b/work");
        let inner = work.join("docs");
        std::fs::create_dir_all(&inner).unwrap();
        let base = std::fs::canonicalize(&base).unwrap();
        let work = base.join("a/b/work");
        let planned = plan(&Spec {
            system: &["/usr"],
            read: &[PathBuf::from("/usr/bin"), work.join("docs")],
            write: std::slice::from_ref(&work),
            devices: &[PathBuf::from("/dev/null")],
            idmap: false,
            unmapped: None,
            proc: Proc::PerRun,
            stage: &base,
        })
        .unwrap();
        let got = rels(&planned);
        let w = work.strip_prefix("/").unwrap().display().to_string();
        // /usr/bin is inside /usr (read-only alike): not bound again. The read-only docs
        // beneath the writable work dir are mounted over it, without parents of their own.
        assert!(got.contains(&"ro usr".to_string()), "{got:?}");
        assert!(!got.iter().any(|g| g == "ro usr/bin"), "{got:?}");
        assert!(got.contains(&format!("rw {w}")), "{got:?}");
        assert!(got.contains(&format!("ro {w}/docs")), "{got:?}");
        // Every directory leading to the work dir is the view's, and comes before it.
        let at = |s: &str| got.iter().position(|g| g == s).unwrap();
        let parent = work
            .parent()
            .unwrap()
            .strip_prefix("/")
            .unwrap()
            .display()
            .to_string();
        assert!(at(&format!("dir {parent}")) < at(&format!("rw {w}")));
        assert!(at("dir dev") < at("dev dev/null"));
        assert!(got.contains(&"link dev/fd".to_string()), "{got:?}");
        assert_eq!(got.last().map(String::as_str), Some("dir proc"));
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_system_symlink_stays_a_symlink_and_the_root_itself_is_refused() {
        // /bin is a symlink on merged-/usr systems; where it is not, it is bound.
        let planned = plan(&Spec {
            system: &["/usr", "/bin"],
            read: &[],
            write: &[],
            devices: &[],
            idmap: false,
            unmapped: None,
            proc: Proc::None,
            stage: Path::new("/tmp"),
        })
        .unwrap();
        let got = rels(&planned);
        let bin_is_link = std::fs::symlink_metadata("/bin")
            .map(|m| m.file_type().is_symlink())
            .unwrap_or(false);
        assert_eq!(
            got.contains(&"link bin".to_string()),
            bin_is_link,
            "{got:?}"
        );
        let err = plan(&Spec {
            system: &[],
            read: &[PathBuf::from("/")],
            write: &[],
            devices: &[],
            idmap: false,
            unmapped: None,
            proc: Proc::None,
            stage: Path::new("/tmp"),
        })
        .unwrap_err();
        assert!(err.contains("granted whole"), "{err}");
    }
}
