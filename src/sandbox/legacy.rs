//! Runs a host of the previous layout left: `work_root/<session>/<invocation>/` directories,
//! each locked while its run lived, holding `manifest.json` (files backed up beside
//! themselves, not yet committed) or `committed.json` (the change is in place), or neither
//! (the run stopped before its manifest). Read once, as journals, so that recovery closes them
//! like any other; the directories are then removed.

use super::backup::{Entry, Identity, Saved};
use super::journal::{lock, Found, Manifest};
use serde::Deserialize;
use std::path::{Component, Path, PathBuf};

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum OldSaved {
    Absent,
    File { backup: PathBuf, identity: Identity },
    Symlink { target: PathBuf },
}

#[derive(Deserialize)]
struct OldEntry {
    path: PathBuf,
    saved: OldSaved,
}

#[derive(Deserialize)]
struct OldManifest {
    session_id: String,
    invocation_id: String,
    tool_name: String,
    entries: Vec<OldEntry>,
}

/// The id a directory name of the old layout stands for (`%XX` escapes).
fn from_component(name: &str) -> Option<String> {
    let b = name.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            out.push(u8::from_str_radix(name.get(i + 1..i + 3)?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    if out == [0] {
        out.clear();
    }
    String::from_utf8(out).ok()
}

fn entry(old: OldEntry) -> Option<Entry> {
    let (parent, name) = (old.path.parent()?, old.path.file_name()?);
    let dir: PathBuf = parent
        .components()
        .filter(|c| !matches!(c, Component::RootDir))
        .collect();
    let saved = match old.saved {
        OldSaved::Absent => Saved::Absent,
        OldSaved::Symlink { target } => Saved::Symlink { target },
        OldSaved::File { backup, identity } => {
            if backup.parent() != Some(parent) {
                return None;
            }
            Saved::File {
                backup: PathBuf::from(backup.file_name()?),
                identity,
            }
        }
    };
    Some(Entry {
        root: PathBuf::from("/"),
        dir,
        name: PathBuf::from(name),
        saved,
    })
}

/// A dead run of the old layout: what it left, as a journal, and its directory, to remove once
/// the run is closed.
pub(crate) struct Legacy {
    pub found: Found,
    pub dir: PathBuf,
}

/// The dead runs of the old layout under `work_root`.
pub(crate) fn dead_runs(work_root: &Path) -> Vec<Legacy> {
    let mut out = Vec::new();
    let Ok(sessions) = std::fs::read_dir(work_root) else {
        return out;
    };
    for s in sessions.flatten() {
        let name = s.file_name().to_string_lossy().into_owned();
        if name.starts_with("run-") || name.starts_with('.') || !s.path().is_dir() {
            continue;
        }
        let Some(session_id) = from_component(&name) else {
            continue;
        };
        let Ok(runs) = std::fs::read_dir(s.path()) else {
            continue;
        };
        for r in runs.flatten() {
            let dir = r.path();
            // A live host of the old version holds its lock.
            let held = match lock(&dir, false) {
                Ok(Some(l)) => Some(l),
                Ok(None) => continue,
                Err(_) => None,
            };
            let read = |file: &str| {
                std::fs::read(dir.join(file))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<OldManifest>(&b).ok())
            };
            let (old, committed) = match (read("manifest.json"), read("committed.json")) {
                (Some(m), _) => (Some(m), false),
                (None, Some(m)) => (Some(m), true),
                (None, None) => (None, false),
            };
            let manifest = match old {
                Some(m) => Manifest {
                    session_id: m.session_id,
                    invocation_id: m.invocation_id,
                    tool_name: m.tool_name,
                    entries: m.entries.into_iter().filter_map(entry).collect(),
                },
                None => match r.file_name().to_str().and_then(from_component) {
                    Some(invocation_id) => Manifest {
                        session_id: session_id.clone(),
                        invocation_id,
                        tool_name: String::new(),
                        entries: Vec::new(),
                    },
                    None => continue,
                },
            };
            drop(held);
            out.push(Legacy {
                found: Found {
                    committed,
                    manifest,
                    blobs: Vec::new(),
                },
                dir,
            });
        }
    }
    out
}
