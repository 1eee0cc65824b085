//! File tools confined to allowed roots: [`FileReadTool`] (T1), [`FileWriteTool`] (T2) and
//! [`FileEditTool`] (T3).
//!
//! Every path is resolved beneath a root's directory fd (see [`Roots`]); `..` out of a root,
//! absolute or escaping symlinks, magic links and re-entry through `../root/x` are refused.
//! Writes are atomic (temp file, then rename) and never go through a symlink or into a file
//! with several hard links.

mod config;
pub(crate) mod confine;
pub(crate) use confine::openat2_supported;
mod ops;
mod patch;
pub(crate) mod schema;

pub use config::FileToolConfig;
pub use confine::{ConfineError, Located, ResolveMode, Roots};

use super::params::required_str;
use super::{
    FileAffectingTool, Tool, ToolCapability, ToolError, ToolRequest, ToolResult, ValidationResult,
};
use crate::tools::Recoverable;
use ops::FsError;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Default cap on a read: 10 MiB.
pub const DEFAULT_MAX_READ_BYTES: u64 = 10 * 1024 * 1024;

fn fail(req: &ToolRequest, e: FsError) -> ToolResult {
    let recoverable = e.recoverable();
    ToolResult::failure_of(
        &req.invocation_id,
        e.kind(),
        e.to_string(),
        Recoverable::from(recoverable),
    )
}

fn locate(roots: &Roots, req: &ToolRequest, path: &str) -> Result<Located, ToolResult> {
    roots
        .locate(path)
        .map_err(|e| fail(req, FsError::Confine(e)))
}

/// Files the file tools must not write: the shell's allowed executables, by device and inode
/// (so a hard link or another name for one is caught too). Rewriting one would let the next
/// shell run execute new content under an approval given for the old.
#[derive(Clone, Debug, Default)]
struct Protected(Vec<(u64, u64)>);

impl Protected {
    fn new(paths: &[PathBuf]) -> Protected {
        use std::os::unix::fs::MetadataExt;
        Protected(
            paths
                .iter()
                .filter_map(|p| std::fs::metadata(p).ok())
                .map(|m| (m.dev(), m.ino()))
                .collect(),
        )
    }

    fn check(
        &self,
        roots: &Roots,
        req: &ToolRequest,
        loc: &Located,
        shown: &str,
    ) -> Result<(), ToolResult> {
        use std::os::unix::fs::MetadataExt;
        if self.0.is_empty() {
            return Ok(());
        }
        let Ok(entry) = roots.entry_path(loc) else {
            return Ok(());
        };
        let Ok(m) = std::fs::symlink_metadata(&entry) else {
            return Ok(()); // nothing there yet: not an executable the shell may run
        };
        if self.0.contains(&(m.dev(), m.ino())) {
            return Err(ToolResult::failure_of(
                &req.invocation_id,
                crate::tools::ToolErrorKind::NotAllowed,
                format!(
                    "{shown} is an executable the shell tool is allowed to run; the file tools do not write, edit or delete it"
                ),
                Recoverable::No,
            ));
        }
        Ok(())
    }
}

fn operation<'a>(req: &'a ToolRequest, allowed: &[&str]) -> Result<&'a str, ToolResult> {
    let op = required_str(req, "operation")?;
    if allowed.contains(&op) {
        Ok(op)
    } else {
        Err(ToolResult::failure_of(
            &req.invocation_id,
            crate::tools::ToolErrorKind::InvalidRequest,
            format!(
                "unknown operation {op:?}; use one of: {}",
                allowed.join(", ")
            ),
            Recoverable::Yes,
        ))
    }
}

fn validation(r: Result<(), ToolResult>) -> ValidationResult {
    match r {
        Ok(()) => ValidationResult::Valid,
        Err(ToolResult::Failure { reason, .. }) => ValidationResult::Invalid { reason },
        Err(ToolResult::Success { .. }) => ValidationResult::Valid,
    }
}

/// A read's answer: the text, or for bytes that are not UTF-8 a lossy text plus the exact
/// bytes in base64 (`data.content_base64`).
fn text_success(req: &ToolRequest, bytes: Vec<u8>) -> ToolResult {
    let mut metadata = BTreeMap::new();
    metadata.insert("bytes".to_owned(), bytes.len().to_string());
    let mut data = serde_json::json!({"bytes": bytes.len(), "utf8": true});
    let output = match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => {
            metadata.insert("lossy_utf8".to_owned(), "true".to_owned());
            data["utf8"] = false.into();
            data["content_base64"] = crate::text::base64(e.as_bytes()).into();
            String::from_utf8_lossy(e.as_bytes()).into_owned()
        }
    };
    ToolResult::Success {
        invocation_id: req.invocation_id.clone(),
        output,
        metadata,
        data: Some(data),
    }
}

/// Reads files inside the allowed roots: `{"operation": "read" | "list" | "exists", "path": ...}`.
/// Tier T1. An empty root list denies every path.
#[derive(Debug)]
pub struct FileReadTool {
    roots: Roots,
    max_read_bytes: u64,
}

impl FileReadTool {
    /// A reader over `allowed_paths` with the default read cap.
    ///
    /// # Errors
    /// [`ToolError::Root`] when a root does not exist or cannot be opened.
    pub fn new(allowed_paths: &[PathBuf]) -> Result<Self, ToolError> {
        Self::with_roots(
            Roots::open(allowed_paths).map_err(ToolError::Root)?,
            DEFAULT_MAX_READ_BYTES,
        )
    }

    /// A reader over already-opened roots with a read cap in bytes.
    ///
    /// # Errors
    /// [`ToolError::InvalidSetting`] when `max_read_bytes` is 0.
    pub fn with_roots(roots: Roots, max_read_bytes: u64) -> Result<Self, ToolError> {
        if max_read_bytes == 0 {
            return Err(ToolError::InvalidSetting {
                field: "max_read_bytes",
                reason: "must be greater than 0".into(),
            });
        }
        Ok(FileReadTool {
            roots,
            max_read_bytes,
        })
    }

    fn run(&self, req: &ToolRequest) -> Result<ToolResult, ToolResult> {
        let op = operation(req, &["read", "list", "exists"])?;
        let path = required_str(req, "path")?;
        let loc = locate(&self.roots, req, path)?;
        Ok(match op {
            "read" => text_success(
                req,
                ops::read(&self.roots, &loc, self.max_read_bytes).map_err(|e| fail(req, e))?,
            ),
            "list" => {
                let entries = ops::list(&self.roots, &loc).map_err(|e| fail(req, e))?;
                let lines: Vec<String> = entries.iter().map(|(n, k)| format!("{n}\t{k}")).collect();
                let listed: Vec<serde_json::Value> = entries
                    .iter()
                    .map(|(n, k)| serde_json::json!({"name": n, "kind": k}))
                    .collect();
                ToolResult::success(&req.invocation_id, lines.join("\n"))
                    .with_data(serde_json::json!({ "entries": listed }))
            }
            _ => {
                let found = ops::exists(&self.roots, &loc).map_err(|e| fail(req, e))?;
                ToolResult::success(&req.invocation_id, found.to_string())
                    .with_data(serde_json::json!({ "exists": found }))
            }
        })
    }
}

impl Tool for FileReadTool {
    crate::tools::table::identity_from_row!();

    fn required_capabilities(&self) -> &[ToolCapability] {
        &[ToolCapability::FileRead]
    }

    fn validate_request(&self, request: &ToolRequest) -> ValidationResult {
        validation(
            operation(request, &["read", "list", "exists"])
                .and_then(|_| required_str(request, "path"))
                .map(|_| ()),
        )
    }

    fn execute(&self, request: &ToolRequest) -> ToolResult {
        match self.run(request) {
            Ok(r) | Err(r) => r,
        }
    }
}

/// Writes and deletes files inside the allowed roots:
/// `{"operation": "write", "path": ..., "content": ...}` or `{"operation": "delete", "path": ...}`.
/// Tier T2. Writes are atomic; the sandbox backs up and restores the target.
#[derive(Debug)]
pub struct FileWriteTool {
    roots: Roots,
    protected: Protected,
}

impl FileWriteTool {
    /// A writer over `allowed_paths`.
    ///
    /// # Errors
    /// [`ToolError::Root`] when a root does not exist or cannot be opened.
    pub fn new(allowed_paths: &[PathBuf]) -> Result<Self, ToolError> {
        Ok(Self::with_roots(
            Roots::open(allowed_paths).map_err(ToolError::Root)?,
        ))
    }

    /// A writer over already-opened roots.
    pub fn with_roots(roots: Roots) -> Self {
        FileWriteTool {
            roots,
            protected: Protected::default(),
        }
    }

    /// Refuses to write or delete any of `executables` (the shell's allowlist), however it is
    /// named.
    pub fn protecting(mut self, executables: &[PathBuf]) -> Self {
        self.protected = Protected::new(executables);
        self
    }

    fn run(&self, req: &ToolRequest) -> Result<ToolResult, ToolResult> {
        let op = operation(req, &["write", "delete"])?;
        let path = required_str(req, "path")?;
        let loc = locate(&self.roots, req, path)?;
        self.protected.check(&self.roots, req, &loc, path)?;
        if op == "write" {
            let content = required_str(req, "content")?;
            ops::write_atomic(&self.roots, &loc, content.as_bytes()).map_err(|e| fail(req, e))?;
            Ok(ToolResult::success(
                &req.invocation_id,
                format!("wrote {} bytes to {path}", content.len()),
            ))
        } else {
            ops::delete(&self.roots, &loc).map_err(|e| fail(req, e))?;
            Ok(ToolResult::success(
                &req.invocation_id,
                format!("deleted {path}"),
            ))
        }
    }
}

impl Tool for FileWriteTool {
    crate::tools::table::identity_from_row!();

    fn required_capabilities(&self) -> &[ToolCapability] {
        &[ToolCapability::FileWrite]
    }

    fn validate_request(&self, request: &ToolRequest) -> ValidationResult {
        validation((|| {
            let op = operation(request, &["write", "delete"])?;
            required_str(request, "path")?;
            if op == "write" {
                required_str(request, "content")?;
            }
            Ok(())
        })())
    }

    fn execute(&self, request: &ToolRequest) -> ToolResult {
        match self.run(request) {
            Ok(r) | Err(r) => r,
        }
    }

    fn as_file_affecting(&self) -> Option<&dyn FileAffectingTool> {
        Some(self)
    }
}

type Kinded = (crate::tools::ToolErrorKind, String);

fn confine_kinded(e: ConfineError) -> Kinded {
    (e.kind(), e.to_string())
}

fn target_path(roots: &Roots, req: &ToolRequest) -> Result<Vec<PathBuf>, Kinded> {
    let path = required_str(req, "path").map_err(reason)?;
    let loc = roots.locate(path).map_err(confine_kinded)?;
    Ok(vec![roots.entry_path(&loc).map_err(confine_kinded)?])
}

fn reason(r: ToolResult) -> Kinded {
    let kind = r.error_kind().unwrap_or_default();
    match r {
        ToolResult::Failure { reason, .. } => (kind, reason),
        ToolResult::Success { output, .. } => (kind, output),
    }
}

impl FileAffectingTool for FileWriteTool {
    fn affected_paths(&self, request: &ToolRequest) -> Result<Vec<PathBuf>, String> {
        self.affected_paths_or_kind(request).map_err(|(_, r)| r)
    }

    fn affected_paths_or_kind(&self, request: &ToolRequest) -> Result<Vec<PathBuf>, Kinded> {
        target_path(&self.roots, request)
    }

    fn confining_roots(&self) -> Vec<PathBuf> {
        self.roots.canonical_paths()
    }
}

/// Edits existing files inside the allowed roots. Tier T3.
///
/// - `{"operation": "append", "path", "content"}`: adds `content` at the end.
/// - `{"operation": "replace", "path", "target", "replacement"}`: replaces `target`, which must
///   occur exactly once.
/// - `{"operation": "patch", "patch"}`: applies a unified diff with the real `patch` binary
///   (`--batch --forward -p0`, a `--dry-run` first) on private copies, then writes the results
///   back atomically. Every file in the diff's headers must lie under a root.
#[derive(Debug)]
pub struct FileEditTool {
    roots: Roots,
    max_read_bytes: u64,
    protected: Protected,
}

const EDIT_OPS: &[&str] = &["append", "replace", "patch"];

impl FileEditTool {
    /// An editor over `allowed_paths`.
    ///
    /// # Errors
    /// [`ToolError::Root`] when a root does not exist or cannot be opened.
    pub fn new(allowed_paths: &[PathBuf]) -> Result<Self, ToolError> {
        Ok(Self::with_roots(
            Roots::open(allowed_paths).map_err(ToolError::Root)?,
        ))
    }

    /// An editor over already-opened roots.
    pub fn with_roots(roots: Roots) -> Self {
        FileEditTool {
            roots,
            max_read_bytes: DEFAULT_MAX_READ_BYTES,
            protected: Protected::default(),
        }
    }

    /// Refuses to edit or patch any of `executables` (the shell's allowlist), however it is
    /// named.
    pub fn protecting(mut self, executables: &[PathBuf]) -> Self {
        self.protected = Protected::new(executables);
        self
    }

    fn run(&self, req: &ToolRequest) -> Result<ToolResult, ToolResult> {
        let op = operation(req, EDIT_OPS)?;
        if op == "patch" {
            let diff = required_str(req, "patch")?;
            if let Ok(files) = patch::parse(diff) {
                for f in files {
                    let loc = locate(&self.roots, req, &f.path)?;
                    self.protected.check(&self.roots, req, &loc, &f.path)?;
                }
            }
            return patch::apply(&self.roots, req, diff, self.max_read_bytes);
        }
        let path = required_str(req, "path")?;
        let loc = locate(&self.roots, req, path)?;
        self.protected.check(&self.roots, req, &loc, path)?;
        let old = ops::read(&self.roots, &loc, self.max_read_bytes).map_err(|e| fail(req, e))?;
        let new = if op == "append" {
            let content = required_str(req, "content")?;
            let mut new = old;
            new.extend_from_slice(content.as_bytes());
            new
        } else {
            let target = required_str(req, "target")?;
            let replacement = required_str(req, "replacement")?;
            if target.is_empty() {
                return Err(ToolResult::failure(
                    &req.invocation_id,
                    "parameter \"target\" is empty; give the exact text to replace",
                    Recoverable::Yes,
                ));
            }
            let text = String::from_utf8(old).map_err(|_| {
                ToolResult::failure(
                    &req.invocation_id,
                    format!("{path} is not UTF-8 text"),
                    Recoverable::No,
                )
            })?;
            let count = text.matches(target).count();
            if count != 1 {
                return Err(ToolResult::failure(
                    &req.invocation_id,
                    format!(
                        "target text occurs {count} times in {path}; it must occur exactly once (add surrounding lines to make it unique)"
                    ),
                    Recoverable::No,
                ));
            }
            text.replacen(target, replacement, 1).into_bytes()
        };
        ops::write_atomic(&self.roots, &loc, &new).map_err(|e| fail(req, e))?;
        Ok(ToolResult::success(
            &req.invocation_id,
            format!("{op} applied to {path}"),
        ))
    }
}

impl Tool for FileEditTool {
    crate::tools::table::identity_from_row!();

    fn required_capabilities(&self) -> &[ToolCapability] {
        &[ToolCapability::FileWrite]
    }

    fn validate_request(&self, request: &ToolRequest) -> ValidationResult {
        validation((|| {
            match operation(request, EDIT_OPS)? {
                "append" => {
                    required_str(request, "path")?;
                    required_str(request, "content")?;
                }
                "replace" => {
                    required_str(request, "path")?;
                    required_str(request, "target")?;
                    required_str(request, "replacement")?;
                }
                _ => {
                    let diff = required_str(request, "patch")?;
                    patch::parse(diff).map_err(|r| {
                        ToolResult::failure(&request.invocation_id, r, Recoverable::Yes)
                    })?;
                }
            }
            Ok(())
        })())
    }

    fn execute(&self, request: &ToolRequest) -> ToolResult {
        match self.run(request) {
            Ok(r) | Err(r) => r,
        }
    }

    fn as_file_affecting(&self) -> Option<&dyn FileAffectingTool> {
        Some(self)
    }
}

impl FileAffectingTool for FileEditTool {
    fn affected_paths(&self, request: &ToolRequest) -> Result<Vec<PathBuf>, String> {
        self.affected_paths_or_kind(request).map_err(|(_, r)| r)
    }

    fn affected_paths_or_kind(&self, request: &ToolRequest) -> Result<Vec<PathBuf>, Kinded> {
        if required_str(request, "operation").ok() == Some("patch") {
            let diff = required_str(request, "patch").map_err(reason)?;
            let files =
                patch::parse(diff).map_err(|r| (crate::tools::ToolErrorKind::InvalidRequest, r))?;
            let mut out = Vec::new();
            for f in files {
                let loc = self.roots.locate(&f.path).map_err(confine_kinded)?;
                out.push(self.roots.entry_path(&loc).map_err(confine_kinded)?);
            }
            return Ok(out);
        }
        target_path(&self.roots, request)
    }

    fn confining_roots(&self) -> Vec<PathBuf> {
        self.roots.canonical_paths()
    }
}
