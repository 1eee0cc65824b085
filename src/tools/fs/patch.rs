//! The `patch` operation: a unified diff applied by the real `patch` binary to private copies,
//! then written back through the confined API.

use super::ops::{self, FsError};
use super::{fail, Located, Roots};
use crate::private_dir::PrivateDir;
use crate::tools::process::{self, resolve_executable, Exit, RunSpec};
use crate::tools::Recoverable;
use crate::tools::{ToolRequest, ToolResult};
use std::path::{Component, Path};
use std::time::Duration;

/// How long `patch` may run; it only touches a few small copies.
const PATCH_TIMEOUT: Duration = Duration::from_secs(30);
/// Cap on `patch`'s own messages kept for the result.
const PATCH_OUTPUT_CAP: usize = 64 * 1024;

/// What a diff does to one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    Modify,
    Create,
    Delete,
}

/// One file a diff touches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PatchFile {
    pub path: String,
    pub change: Change,
}

fn header_name(rest: &str) -> &str {
    rest.split('\t').next().unwrap_or("").trim_end()
}

fn is_normal_diff_command(line: &str) -> bool {
    // `12a13`, `3,5c3,6`, `7d6`, or ed-style `5a` / `2,3d`.
    let Some(pos) = line.find(['a', 'c', 'd']) else {
        return false;
    };
    let (left, right) = (&line[..pos], &line[pos + 1..]);
    let range = |s: &str| {
        !s.is_empty()
            && s.split(',').count() <= 2
            && s.split(',')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    range(left) && (right.is_empty() || range(right))
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a diff header names no file".into());
    }
    let p = Path::new(name);
    if p.is_absolute() {
        return Err(format!(
            "diff header names an absolute path {name:?}; use paths relative to the allowed root (patch runs with -p0)"
        ));
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(format!("diff header {name:?} contains '..'"));
    }
    Ok(())
}

/// Checks that `diff` is a unified diff and lists the files it touches.
///
/// # Errors
/// A reason a model can act on: not unified (normal, ed-style or context diffs are refused),
/// no hunks, renames, absolute or `..` names.
pub(crate) fn parse(diff: &str) -> Result<Vec<PatchFile>, String> {
    let lines: Vec<&str> = diff.lines().collect();
    let mut files = Vec::new();
    let mut i = 0;
    let mut hunks = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.starts_with("***************") || line.starts_with("*** ") {
            return Err("context diffs are not accepted; send a unified diff (diff -u)".into());
        }
        const GIT_HEADERS: &[&str] = &[
            "diff --git ",
            "new file mode",
            "deleted file mode",
            "old mode",
            "new mode",
            "rename from",
            "rename to",
            "copy from",
            "copy to",
            "similarity index",
            "dissimilarity index",
            "GIT binary patch",
        ];
        if let Some(h) = GIT_HEADERS.iter().find(|h| line.starts_with(**h)) {
            return Err(format!(
                "git extended header {h:?} is not accepted (modes, renames, copies, binaries); send a plain unified diff with paths relative to the root"
            ));
        }
        if is_normal_diff_command(line) {
            return Err(format!(
                "line {:?} looks like a normal or ed-style diff; send a unified diff (diff -u)",
                line
            ));
        }
        if line.starts_with("@@ -") {
            if files.is_empty() {
                return Err("a hunk comes before any '--- '/'+++ ' file header".into());
            }
            hunks += 1;
        }
        if let Some(old) = line.strip_prefix("--- ") {
            let Some(new) = lines.get(i + 1).and_then(|l| l.strip_prefix("+++ ")) else {
                i += 1;
                continue; // a removed line that starts with "-- " inside a hunk
            };
            let (old, new) = (header_name(old), header_name(new));
            let file = if old == "/dev/null" {
                check_name(new)?;
                PatchFile {
                    path: new.to_owned(),
                    change: Change::Create,
                }
            } else if new == "/dev/null" {
                check_name(old)?;
                PatchFile {
                    path: old.to_owned(),
                    change: Change::Delete,
                }
            } else if old == new {
                check_name(new)?;
                PatchFile {
                    path: new.to_owned(),
                    change: Change::Modify,
                }
            } else {
                return Err(format!(
                    "the diff renames {old:?} to {new:?}; renames are not supported and with -p0 both names must be the same path"
                ));
            };
            if files.iter().any(|f: &PatchFile| f.path == file.path) {
                return Err(format!("the diff names {:?} twice", file.path));
            }
            files.push(file);
            i += 2;
            continue;
        }
        i += 1;
    }
    if files.is_empty() || hunks == 0 {
        return Err("not a unified diff: no '--- '/'+++ ' headers followed by '@@' hunks".into());
    }
    Ok(files)
}

fn patch_failure(req: &ToolRequest, what: &str, out: &process::RunOutput) -> ToolResult {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout.bytes),
        String::from_utf8_lossy(&out.stderr.bytes)
    );
    let exit = match out.exit {
        Exit::Code(c) => format!("exit code {c}"),
        Exit::Signal(s) => format!("signal {s}"),
    };
    ToolResult::failure(
        &req.invocation_id,
        format!("{what} ({exit}); nothing was changed: {}", text.trim()),
        Recoverable::Yes,
    )
}

/// Applies `diff` to the files it names, under `roots`.
pub(crate) fn apply(
    roots: &Roots,
    req: &ToolRequest,
    diff: &str,
    cap: u64,
) -> Result<ToolResult, ToolResult> {
    let id = &req.invocation_id;
    let files = parse(diff).map_err(|r| ToolResult::failure(id, r, Recoverable::Yes))?;
    let patch_bin = resolve_executable("patch").ok_or_else(|| {
        ToolResult::failure(
            id,
            "the patch binary is not installed on this machine",
            Recoverable::No,
        )
    })?;
    let internal = |e: std::io::Error| copy_failure(id, e);
    let work = PrivateDir::new_in(&std::env::temp_dir(), "correx-patch-").map_err(internal)?;
    let tree = work.path().join("tree");
    std::fs::create_dir(&tree).map_err(internal)?;
    let locs = copy_in(roots, req, &files, &tree, cap)?;
    let patch_file = work.path().join("change.diff");
    std::fs::write(&patch_file, diff).map_err(internal)?;
    let run = |dry: bool| {
        let mut args: Vec<String> = [
            "--batch",
            "--forward",
            "-p0",
            "--no-backup-if-mismatch",
            "--reject-file=-",
            "--quiet",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if dry {
            args.push("--dry-run".into());
        }
        args.push("-i".into());
        args.push(patch_file.display().to_string());
        process::run(&RunSpec {
            program: &patch_bin,
            arg0: None,
            args: &args,
            env: &[],
            cwd: Some(&tree),
            timeout: PATCH_TIMEOUT,
            output_cap: PATCH_OUTPUT_CAP,
        })
        .map_err(|e| ToolResult::failure(id, format!("could not run patch: {e}"), Recoverable::No))
    };
    let dry = run(true)?;
    if dry.exit != Exit::Code(0) || dry.timed_out {
        return Err(patch_failure(req, "the patch does not apply", &dry));
    }
    let real = run(false)?;
    if real.exit != Exit::Code(0) || real.timed_out {
        return Err(patch_failure(req, "patch failed", &real));
    }
    copy_out(roots, req, &files, &locs, &tree)?;
    let names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    Ok(ToolResult::success(
        id,
        format!("patched {}", names.join(", ")),
    ))
}

/// A private copy, under `tree`, of every file the diff changes, each located beneath its
/// root first (a file it creates must not exist yet); gives their locations.
fn copy_in(
    roots: &Roots,
    req: &ToolRequest,
    files: &[PatchFile],
    tree: &Path,
    cap: u64,
) -> Result<Vec<Located>, ToolResult> {
    let id = &req.invocation_id;
    let internal = |e: std::io::Error| copy_failure(id, e);
    let mut locs = Vec::with_capacity(files.len());
    for f in files {
        let loc = roots
            .locate(&f.path)
            .map_err(|e| fail(req, FsError::Confine(e)))?;
        let copy = tree.join(&f.path);
        if let Some(parent) = copy.parent() {
            std::fs::create_dir_all(parent).map_err(internal)?;
        }
        match f.change {
            Change::Modify | Change::Delete => {
                let bytes = ops::read(roots, &loc, cap).map_err(|e| fail(req, e))?;
                std::fs::write(&copy, bytes).map_err(internal)?;
            }
            Change::Create => {
                if ops::exists(roots, &loc).map_err(|e| fail(req, e))? {
                    return Err(ToolResult::failure(
                        id,
                        format!("the diff creates {} but it already exists", f.path),
                        Recoverable::Yes,
                    ));
                }
            }
        }
        locs.push(loc);
    }
    Ok(locs)
}

fn copy_failure(id: &crate::ids::ToolInvocationId, e: std::io::Error) -> ToolResult {
    ToolResult::failure(
        id,
        format!("could not prepare a private copy for patch: {e}"),
        Recoverable::Yes,
    )
}

/// Writes each patched copy back to its file (atomically), or deletes the file whose copy
/// patch removed; a copy that is no longer a regular file writes nothing.
fn copy_out(
    roots: &Roots,
    req: &ToolRequest,
    files: &[PatchFile],
    locs: &[Located],
    tree: &Path,
) -> Result<(), ToolResult> {
    let id = &req.invocation_id;
    for (f, loc) in files.iter().zip(locs) {
        let copy = tree.join(&f.path);
        match std::fs::symlink_metadata(&copy) {
            Ok(m) if !m.file_type().is_file() => {
                return Err(ToolResult::failure(
                    id,
                    format!(
                        "patch left {} as something other than a regular file; nothing was written",
                        f.path
                    ),
                    Recoverable::No,
                ))
            }
            _ => {}
        }
        match std::fs::read(&copy) {
            Ok(bytes) => ops::write_atomic(roots, loc, &bytes).map_err(|e| fail(req, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                ops::delete(roots, loc).map_err(|e| fail(req, e))?
            }
            Err(e) => return Err(copy_failure(id, e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unified_diffs_parse_and_others_are_refused() {
        let d = "--- a.txt\n+++ a.txt\n@@ -1 +1 @@\n-x\n+y\n";
        assert_eq!(parse(d).unwrap()[0].change, Change::Modify);
        let create = "--- /dev/null\n+++ new.txt\n@@ -0,0 +1 @@\n+y\n";
        assert_eq!(parse(create).unwrap()[0].change, Change::Create);
        assert!(parse("1c1\n< x\n---\n> y\n").is_err());
        assert!(parse("*** a\n--- a\n***************\n").is_err());
        assert!(parse("--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n").is_err());
        assert!(parse("--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-x\n+y\n").is_err());
        assert!(parse("--- ../x\n+++ ../x\n@@ -1 +1 @@\n-x\n+y\n").is_err());
        assert!(parse("just text").is_err());
    }
}
