//! Staged workspaces: a confined run's working dirs as overlays in its view, so what it
//! changes lands in a layer correx owns while the real tree stays as it was; afterwards the
//! layer is read as a change set and promoted (renamed into place through a journal, the
//! replaced and removed paths kept in the layer) or discarded.
//!
//! [`Staging`] is one tool's: its layers live in a directory of its own beneath the tool's
//! temp base (locked while the tool lives), so a host that dies leaves them for the next
//! tool on the same base, which finishes or undoes a promotion cut short, keeps the change
//! sets held for the host, and discards the layers of runs that never finished.

mod changes;
pub(crate) mod diff;
mod history;
mod layer;
mod options;
mod promote;

pub use changes::{Change, ChangeKind, ChangeSet, EntryType};
pub use options::{PromotePolicy, StagingOptions, WorkspaceMode};
pub use promote::{Conflict, PromoteError};

pub(crate) use layer::RunLayer;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// Why a staged change set could not be promoted, discarded or read.
#[derive(Debug)]
#[non_exhaustive]
pub enum WorkspaceError {
    /// No change set of that invocation is held (never staged, promoted or discarded already,
    /// or promoted or discarded by policy).
    NotHeld {
        /// The invocation.
        invocation_id: String,
    },
    /// Promotion refused or failed; nothing was applied.
    Promote(PromoteError),
    /// Reading or removing the layer failed.
    Io {
        /// The layer's directory.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// Settled (promoted or discarded as asked), but the event log could not record it.
    Unrecorded(crate::events::EventStoreError),
    /// No promoted change set of that invocation is kept for the session (never promoted,
    /// rewound already, or dropped past `staging.max_rewind_bytes`).
    NotRewindable {
        /// The invocation.
        invocation_id: String,
    },
    /// A rewind was refused: paths it would take back were changed since by someone else.
    /// Nothing was changed.
    ChangedSince {
        /// Each path, and what happened to it.
        conflicts: Vec<Conflict>,
    },
}

impl std::fmt::Display for WorkspaceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkspaceError::NotHeld { invocation_id } => write!(
                f,
                "no staged change set of invocation {invocation_id:?} is held (it was promoted \
                 or discarded, or never staged)"
            ),
            WorkspaceError::Promote(e) => e.fmt(f),
            WorkspaceError::Io { path, source } => {
                write!(f, "staged layer {}: {source}", path.display())
            }
            WorkspaceError::Unrecorded(e) => write!(
                f,
                "the change set was settled as asked, but the log could not record it: {e}"
            ),
            WorkspaceError::NotRewindable { invocation_id } => write!(
                f,
                "no promoted change set of invocation {invocation_id:?} is kept for its session \
                 (never promoted, rewound already, or dropped past staging.max_rewind_bytes)"
            ),
            WorkspaceError::ChangedSince { conflicts } => {
                write!(f, "not rewound: the real tree changed since: ")?;
                promote::write_conflicts(f, conflicts)?;
                write!(f, " (nothing was changed)")
            }
        }
    }
}

impl std::error::Error for WorkspaceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WorkspaceError::Promote(e) => Some(e),
            WorkspaceError::Io { source, .. } => Some(source),
            WorkspaceError::Unrecorded(e) => Some(e),
            WorkspaceError::NotHeld { .. }
            | WorkspaceError::NotRewindable { .. }
            | WorkspaceError::ChangedSince { .. } => None,
        }
    }
}

impl WorkspaceError {
    /// The stable kind: `not_held`, `conflict`, `cross_device`, `io`, `unrecorded`,
    /// `not_rewindable` or `changed_since`.
    pub fn kind(&self) -> &'static str {
        match self {
            WorkspaceError::NotHeld { .. } => "not_held",
            WorkspaceError::Promote(e) => e.kind(),
            WorkspaceError::Io { .. } => "io",
            WorkspaceError::Unrecorded(_) => "unrecorded",
            WorkspaceError::NotRewindable { .. } => "not_rewindable",
            WorkspaceError::ChangedSince { .. } => "changed_since",
        }
    }
}

/// What became of a staged run's change set when it ended.
#[derive(Debug)]
pub(crate) enum Settled {
    /// Applied to the real tree.
    Promoted,
    /// Dropped: the run failed, or its change set was too large (why).
    Discarded(String),
    /// Held for the host to promote or discard.
    Kept,
    /// Promotion was refused or failed; the change set was dropped.
    Refused(PromoteError),
}

/// A finished staged run: its change set and what became of it.
#[derive(Debug)]
pub(crate) struct Staged {
    pub changes: ChangeSet,
    pub settled: Settled,
    pub policy: PromotePolicy,
    pub diff: diff::Rendered,
}

impl Staged {
    /// The run's `workspace` data: the mode, the policy, what became of it, the counts and
    /// every changed path.
    pub fn to_json(&self) -> serde_json::Value {
        let (state, reason, conflicts) = match &self.settled {
            Settled::Promoted => ("promoted", None, None),
            Settled::Discarded(why) => ("discarded", Some(why.clone()), None),
            Settled::Kept => ("kept", None, None),
            Settled::Refused(e) => (
                match e {
                    PromoteError::Conflict { .. } => "conflict",
                    _ => "refused",
                },
                Some(e.to_string()),
                match e {
                    PromoteError::Conflict { conflicts } => serde_json::to_value(conflicts).ok(),
                    _ => None,
                },
            ),
        };
        let mut v = serde_json::json!({
            "mode": "staged",
            "promote": self.policy.as_str(),
            "state": state,
            "summary": self.changes.summary(),
            "changes": changes_json(&self.changes),
            "diff": self.diff.text,
            "diff_truncated": self.diff.truncated,
        });
        if let Some(r) = reason {
            v["reason"] = r.into();
        }
        if let Some(c) = conflicts {
            v["conflicts"] = c;
        }
        v
    }
}

/// Every change as JSON (paths as text; a name that is not UTF-8 is shown lossily).
pub(crate) fn changes_json(set: &ChangeSet) -> serde_json::Value {
    serde_json::Value::Array(
        set.changes
            .iter()
            .filter_map(|c| serde_json::to_value(Shown(c)).ok())
            .collect(),
    )
}

/// A change as shown: its path as text.
struct Shown<'a>(&'a Change);

impl serde::Serialize for Shown<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let c = self.0;
        let mut v = serde_json::json!({
            "path": c.path.to_string_lossy(),
            "kind": c.kind,
            "type": c.entry_type,
        });
        for (k, x) in [("size", c.size), ("before_size", c.before_size)] {
            if let Some(x) = x {
                v[k] = x.into();
            }
        }
        // Permission bits as `ls` and `chmod` say them.
        for (k, x) in [("mode", c.mode), ("before_mode", c.before_mode)] {
            if let Some(x) = x {
                v[k] = format!("{x:04o}").into();
            }
        }
        if let Some(t) = &c.target {
            v["target"] = t.to_string_lossy().into();
        }
        v.serialize(s)
    }
}

/// Makes the directory the tools' staged layers live in (mode 0700) if missing, and checks
/// it is private.
pub(crate) fn make_base(base: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(base) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    crate::private_dir::check_private(base)
}

/// One tool's staged layers. See the module docs.
#[derive(Debug)]
pub(crate) struct Staging {
    dir: PathBuf,
    _lock: std::fs::File,
    roots: Vec<PathBuf>,
    /// A root host's run executes as these ids and its layers hold its files as them:
    /// promoted paths go to each working dir's owner.
    run_ids: Option<(u32, u32)>,
    userxattr: bool,
    /// What a run's Landlock ruleset grants beneath each overlay.
    rights: u64,
    options: StagingOptions,
    /// Layers held for the host, by invocation.
    kept: Mutex<BTreeMap<String, Held>>,
    /// Promoted layers kept for rewind, by session (shared by the tools on the base).
    history: history::History,
    /// What recovery made of dead tools' layers, until the runtime records it.
    recovered: Mutex<Vec<StagedRecovery>>,
    /// The other tools' directories whose lock was held when this one looked: live tools, or
    /// a dead host's whose last process (a run's supervisor between its clone and closing
    /// what it inherited) was still exiting. Looked at again before each run.
    busy: Mutex<Vec<PathBuf>>,
}

impl Staging {
    /// The staging of a tool whose working dirs are `roots`, beneath `base` (made private if
    /// missing); the layers dead tools left there are settled first.
    pub fn open(
        base: &Path,
        roots: &[PathBuf],
        run_ids: Option<(u32, u32)>,
        (userxattr, rights): (bool, u64),
        options: StagingOptions,
    ) -> io::Result<Staging> {
        make_base(base)?;
        // Made under a name the other tools' scan passes over, and named `tool-*` only once
        // its lock is held: a directory without one would look dead to them.
        let new = crate::private_dir::PrivateDir::new_in(base, ".new-")?;
        let lock = crate::private_dir::lock_dir(new.path(), "lock", true)?
            .ok_or_else(|| io::Error::other("a new staging directory is locked already"))?;
        let name = new
            .path()
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(".new-"))
            .map(|id| format!("tool-{id}"))
            .ok_or_else(|| io::Error::other("a new staging directory has no name"))?;
        let dir = base.join(name);
        std::fs::rename(new.path(), &dir)?;
        let _ = new.keep();
        let staging = Staging {
            dir,
            _lock: lock,
            roots: roots.to_vec(),
            run_ids,
            userxattr,
            rights,
            history: history::History::new(base, options.max_rewind_bytes),
            options,
            kept: Mutex::new(BTreeMap::new()),
            recovered: Mutex::new(Vec::new()),
            busy: Mutex::new(Vec::new()),
        };
        // Rewinds a dead host cut short first: trimming may not drop a layer half undone.
        staging.history.recover();
        if let Ok(entries) = std::fs::read_dir(base) {
            let dirs = entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter(|e| e.file_name().as_encoded_bytes().starts_with(b"tool-"))
                .map(|e| e.path())
                .filter(|d| *d != staging.dir);
            let busy: Vec<PathBuf> = dirs.filter(|d| !staging.recover(d)).collect();
            *staging.busy.lock() = busy;
        }
        Ok(staging)
    }

    /// Settles every layer of a dead tool's directory and removes it (kept while it holds a
    /// change set for other working dirs); false (nothing done)
    /// when its lock is held.
    fn recover(&self, dir: &Path) -> bool {
        // Missing: a tool that got no further than its directory.
        let lock = match crate::private_dir::lock_dir(dir, "lock", false) {
            Ok(Some(lock)) => Some(lock),
            Ok(None) => return false,
            Err(_) => None,
        };
        let mut left = false;
        if let Ok(layers) = std::fs::read_dir(dir) {
            for l in layers.flatten() {
                if l.file_type().is_ok_and(|t| t.is_dir()) {
                    left |= !self.settle_dead(l.path());
                }
            }
        }
        drop(lock);
        if !left {
            crate::private_dir::remove_tree(dir);
        }
        true
    }

    /// Settles the tools' directories that were busy when last looked at and are free now.
    fn recover_busy(&self) {
        let mut busy = self.busy.lock();
        if !busy.is_empty() {
            busy.retain(|d| d.exists() && !self.recover(d));
        }
    }

    /// A dead tool's layer: a promotion finished stays (kept for rewind), one cut short is
    /// undone; a change set
    /// held for the host is taken over by a tool staging the same working dirs, and left
    /// where it is (false) for one that does while they exist; the layer of a run that never
    /// finished goes.
    fn settle_dead(&self, dir: PathBuf) -> bool {
        let Some(layer) = RunLayer::open(dir.clone()) else {
            crate::private_dir::remove_tree(&dir);
            return true;
        };
        let recovered = |state: &'static str| StagedRecovery {
            session_id: layer.record.session_id.clone(),
            invocation_id: layer.record.invocation_id.clone(),
            state,
        };
        let promoted = promote::recover(&layer);
        if promoted {
            self.recovered.lock().push(recovered("promoted"));
            self.history.add(&layer);
            return true;
        }
        if layer.has(layer::KEPT) {
            if layer.record.roots != self.roots {
                // Gone dirs: no tool can promote it any more.
                if layer.record.roots.iter().all(|r| r.is_dir()) {
                    return false;
                }
                layer.remove();
                return true;
            }
            let to = self.dir.join(dir.file_name().unwrap_or_default());
            if std::fs::rename(&dir, &to).is_ok() {
                let held = Held {
                    session: layer.record.session_id.clone(),
                    bytes: layer::du(&to),
                    set: None,
                };
                self.kept
                    .lock()
                    .insert(layer.record.invocation_id.clone(), held);
                self.recovered.lock().push(recovered("kept"));
                return true;
            }
        }
        self.recovered.lock().push(recovered("discarded"));
        layer.remove();
        true
    }

    /// Makes the layer of one run of `session_id`, before it starts (settling first what a
    /// dead tool's exiting processes kept busy when this one opened).
    pub fn begin(&self, session_id: &str, invocation_id: &str) -> io::Result<RunLayer> {
        self.recover_busy();
        if self.kept.lock().contains_key(invocation_id) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "invocation {invocation_id:?} already has a change set held for the host;                      promote or discard it before running it again"
                ),
            ));
        }
        let name = crate::text::safe_component(invocation_id);
        RunLayer::create(
            self.dir.join(name),
            (session_id, invocation_id),
            &self.roots,
            self.run_ids,
        )
    }

    /// The overlays of a run's layer.
    pub fn overlays(&self, layer: &RunLayer) -> Result<Vec<crate::sys::view::Overlay>, String> {
        layer.overlays(self.userxattr, self.rights)
    }

    fn owners(&self, layer: &RunLayer) -> Vec<Option<(u32, u32)>> {
        use std::os::unix::fs::MetadataExt;
        layer
            .record
            .roots
            .iter()
            .map(|r| {
                self.run_ids
                    .and_then(|_| std::fs::metadata(r).ok().map(|m| (m.uid(), m.gid())))
            })
            .collect()
    }

    /// After a run (every process of it gone): its change set, settled as the policy says —
    /// promoted when it `succeeded` (`on_success`), held for the host (`manual`), discarded
    /// otherwise, or when it passes a bound.
    pub fn finish(&self, layer: RunLayer, succeeded: bool) -> io::Result<Staged> {
        let read = layer.changes();
        let changes = match read {
            Ok(c) => c,
            Err(e) => {
                layer.remove();
                return Err(e);
            }
        };
        seam("staged");
        let diff = diff::render(&layer, &changes);
        let policy = self.options.promote;
        let too_large = (changes.bytes > self.options.max_run_bytes).then(|| {
            format!(
                "its change set holds {} bytes, more than staging.max_run_bytes ({})",
                changes.bytes, self.options.max_run_bytes
            )
        });
        let settled = match (policy, too_large) {
            (_, Some(why)) => Settled::Discarded(why),
            (PromotePolicy::OnSuccess, None) if !succeeded => {
                Settled::Discarded("the run did not succeed".into())
            }
            (PromotePolicy::OnSuccess, None) if changes.changes.is_empty() => Settled::Promoted,
            (PromotePolicy::OnSuccess, None) => {
                match promote::promote(&layer, &changes, &self.owners(&layer)) {
                    Ok(()) => Settled::Promoted,
                    Err(e) => Settled::Refused(e),
                }
            }
            (PromotePolicy::Manual, None) => self.keep(&layer, &changes),
        };
        match settled {
            Settled::Kept => {}
            Settled::Promoted if !changes.changes.is_empty() => self.history.add(&layer),
            _ => layer.remove(),
        }
        Ok(Staged {
            changes,
            settled,
            policy,
            diff,
        })
    }

    /// Holds a layer for the host, within the bound on all it holds.
    fn keep(&self, layer: &RunLayer, set: &ChangeSet) -> Settled {
        let bytes = layer.bytes();
        let mut kept = self.kept.lock();
        let held: u64 = kept.values().map(|h| h.bytes).sum();
        if held + bytes > self.options.max_kept_bytes {
            return Settled::Discarded(format!(
                "holding its {bytes} bytes would pass staging.max_kept_bytes ({}; {held} held)",
                self.options.max_kept_bytes
            ));
        }
        if let Err(e) = layer.make_durable().and_then(|()| layer.mark(layer::KEPT)) {
            return Settled::Discarded(format!("it could not be held: {e}"));
        }
        let held = Held {
            session: layer.record.session_id.clone(),
            bytes,
            set: Some(set.clone()),
        };
        kept.insert(layer.record.invocation_id.clone(), held);
        Settled::Kept
    }

    /// A held layer, out of the table while the host's call works on it.
    fn take(&self, invocation_id: &str) -> Result<(RunLayer, Held), WorkspaceError> {
        let not_held = || WorkspaceError::NotHeld {
            invocation_id: invocation_id.to_owned(),
        };
        let held = self
            .kept
            .lock()
            .remove(invocation_id)
            .ok_or_else(not_held)?;
        let dir = self.dir.join(crate::text::safe_component(invocation_id));
        Ok((RunLayer::open(dir).ok_or_else(not_held)?, held))
    }

    fn put_back(&self, layer: &RunLayer, held: Held) {
        self.kept
            .lock()
            .insert(layer.record.invocation_id.clone(), held);
    }
}

/// A held layer's change set: as read when its run ended, or read again.
fn change_set(layer: &RunLayer, held: &Held) -> Result<ChangeSet, WorkspaceError> {
    match &held.set {
        Some(set) => Ok(set.clone()),
        None => layer.changes().map_err(|source| WorkspaceError::Io {
            path: layer.dir.clone(),
            source,
        }),
    }
}

/// What recovery made of a dead tool's staged run: its change set `promoted` (the promotion
/// had finished), `kept` (held for the host, taken over) or `discarded` (the run never
/// finished, or its promotion was cut short and undone: the working dirs are as they were).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedRecovery {
    /// The run's session.
    pub session_id: String,
    /// The run's invocation.
    pub invocation_id: String,
    /// `promoted`, `kept` or `discarded`.
    pub state: &'static str,
}

/// A layer held for the host.
#[derive(Debug)]
struct Held {
    session: String,
    bytes: u64,
    /// Its change set as read when the run ended (the layer is this tool's alone, so it
    /// holds); `None` for one taken over from a dead tool or after a failed promote: read
    /// again.
    set: Option<ChangeSet>,
}

/// A staged tool's change sets held for the host (`staging.promote: "manual"`): listed, read,
/// promoted or discarded by invocation. [`Tool::workspace`](crate::Tool::workspace) gives it.
pub trait Workspace: Send + Sync {
    /// The change sets held, oldest invocation first: (session, invocation).
    fn held(&self) -> Vec<(String, String)>;

    /// A held change set, read again.
    ///
    /// # Errors
    /// [`WorkspaceError::NotHeld`], [`WorkspaceError::Io`].
    fn changes(&self, invocation_id: &str) -> Result<ChangeSet, WorkspaceError>;

    /// The unified diff of a held change set's text files, read again: at most 256 KiB, cut
    /// at a file's end (the change set lists every path).
    ///
    /// # Errors
    /// [`WorkspaceError::NotHeld`], [`WorkspaceError::Io`].
    fn diff(&self, invocation_id: &str) -> Result<String, WorkspaceError>;

    /// Promotes a held change set through the journal; refused (a conflict), it stays held
    /// and nothing was applied.
    ///
    /// # Errors
    /// [`WorkspaceError`].
    fn promote(&self, invocation_id: &str) -> Result<ChangeSet, WorkspaceError>;

    /// Discards a held change set.
    ///
    /// # Errors
    /// [`WorkspaceError::NotHeld`].
    fn discard(&self, invocation_id: &str) -> Result<ChangeSet, WorkspaceError>;

    /// The promoted change sets kept for rewinding `session_id`, oldest first: their
    /// invocations.
    fn rewindable(&self, session_id: &str) -> Vec<String>;

    /// What recovery made of the staged runs a dead host left, since this was last asked
    /// (the runtime records each as `workspace.settled` by `recovery`).
    fn recovered(&self) -> Vec<StagedRecovery>;

    /// Puts the working dirs back to what they were before `invocation_id`'s change set was
    /// promoted: every promoted change set of the session from the newest back to that one
    /// is taken back from its backups, newest first. Returns each invocation taken back with
    /// the counts of its steps (`{"paths", "added", "modified", "deleted", "mode_changed"}`),
    /// newest first.
    ///
    /// # Errors
    /// [`WorkspaceError::NotRewindable`]; [`WorkspaceError::ChangedSince`] (nothing changed);
    /// [`WorkspaceError::Io`].
    fn rewind(
        &self,
        session_id: &str,
        invocation_id: &str,
    ) -> Result<Vec<(String, serde_json::Value)>, WorkspaceError>;
}

impl Workspace for Staging {
    fn held(&self) -> Vec<(String, String)> {
        self.recover_busy();
        self.kept
            .lock()
            .iter()
            .map(|(inv, h)| (h.session.clone(), inv.clone()))
            .collect()
    }

    fn changes(&self, invocation_id: &str) -> Result<ChangeSet, WorkspaceError> {
        let (layer, held) = self.take(invocation_id)?;
        let read = change_set(&layer, &held);
        self.put_back(&layer, held);
        read
    }

    fn diff(&self, invocation_id: &str) -> Result<String, WorkspaceError> {
        let (layer, held) = self.take(invocation_id)?;
        let read = change_set(&layer, &held).map(|set| diff::render(&layer, &set).text);
        self.put_back(&layer, held);
        read
    }

    fn promote(&self, invocation_id: &str) -> Result<ChangeSet, WorkspaceError> {
        let (layer, held) = self.take(invocation_id)?;
        let done = change_set(&layer, &held).and_then(|set| {
            promote::promote(&layer, &set, &self.owners(&layer))
                .map(|()| set)
                .map_err(WorkspaceError::Promote)
        });
        match &done {
            Ok(_) => self.history.add(&layer),
            // Undone, so the layer is as it was; read again all the same.
            Err(_) => self.put_back(
                &layer,
                Held {
                    bytes: layer.bytes(),
                    set: None,
                    ..held
                },
            ),
        }
        done
    }

    fn rewindable(&self, session_id: &str) -> Vec<String> {
        self.history.kept(session_id)
    }

    fn recovered(&self) -> Vec<StagedRecovery> {
        std::mem::take(&mut *self.recovered.lock())
    }

    fn rewind(
        &self,
        session_id: &str,
        invocation_id: &str,
    ) -> Result<Vec<(String, serde_json::Value)>, WorkspaceError> {
        self.history
            .rewind(session_id, invocation_id)
            .map_err(|r| match r {
                history::Refused::NotKept => WorkspaceError::NotRewindable {
                    invocation_id: invocation_id.to_owned(),
                },
                history::Refused::Changed(conflicts) => WorkspaceError::ChangedSince { conflicts },
                history::Refused::Io(path, source) => WorkspaceError::Io { path, source },
            })
    }

    fn discard(&self, invocation_id: &str) -> Result<ChangeSet, WorkspaceError> {
        let (layer, held) = self.take(invocation_id)?;
        let set = change_set(&layer, &held).unwrap_or_default();
        layer.remove();
        Ok(set)
    }
}

impl Drop for Staging {
    /// Layers held for the host stay (the next tool on the base takes them over); the rest
    /// of the tool's directory goes.
    fn drop(&mut self) {
        if self.kept.get_mut().is_empty() {
            crate::private_dir::remove_tree(&self.dir);
        }
    }
}

/// Test hook (feature `test-hooks`): `CORREX_TEST_ABORT_AT=<step>` aborts the process at that
/// step of a staged run's end (`staged`, `journaled`, `applying`, `promoted`).
#[cfg(not(feature = "test-hooks"))]
fn seam(_step: &str) {}

/// See the other `seam`.
#[cfg(feature = "test-hooks")]
fn seam(step: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| std::env::var("CORREX_TEST_ABORT_AT").ok());
    if at.as_deref() == Some(step) {
        std::process::abort();
    }
}
