//! Staged workspaces: a confined run's working dir is an overlay, so the real tree does not
//! change while it runs. Real programs (git, pip, make, rm -rf, mv, chmod, a symlink swap)
//! run staged, as root and as nobody: the change set lists exactly what changed (checked
//! against a manifest of the tree taken outside correx before the run and inside the run at
//! its end), a held change set leaves the tree as it was, discard leaves it byte-identical
//! (mtimes too), and promote leaves it what the run saw. A file the host changed meanwhile is
//! a conflict and nothing is applied. A host killed at any point of a run or a promote leaves
//! the tree in one of its two states, and the next tool on the base leaves no layer behind.

use crate::util::{child_test, is_child, write_wheel, TempDir};
use correx::{EventStore, SessionId, ShellOptions, ShellTool, Tool, ToolRequest, ToolResult};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

// ------------------------------------------------------------------ manifests

/// A tree as a manifest: each path beneath the root (relative) to its type, permission bits
/// and content (a file's SHA-256, a symlink's target). Written once, run by the host's python
/// outside correx and by the run inside its view.
const MANIFEST_PY: &str = r#"
import hashlib, json, os, stat, sys
root = sys.argv[1]
strict = len(sys.argv) > 2
out = {}
for d, dirs, files in os.walk(root):
    for n in sorted(dirs + files):
        p = os.path.join(d, n)
        st = os.lstat(p)
        rel = os.path.relpath(p, root)
        if rel == ".manifest.py":
            continue
        mode = "%04o" % stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            e = ["symlink", "", os.readlink(p)]
        elif stat.S_ISDIR(st.st_mode):
            e = ["dir", mode, ""]
        elif stat.S_ISREG(st.st_mode):
            with open(p, "rb") as f:
                e = ["file", mode, hashlib.sha256(f.read()).hexdigest()]
        else:
            e = ["special", mode, ""]
        if strict:
            e += [st.st_mtime_ns, st.st_uid, st.st_gid]
        out[rel] = e
print("MANIFEST " + json.dumps(out, sort_keys=True))
"#;

type Manifest = BTreeMap<String, Value>;

fn parse_manifest(text: &str) -> Result<Manifest, Box<dyn std::error::Error>> {
    let line = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("MANIFEST "))
        .ok_or_else(|| format!("no manifest in: {text}"))?;
    Ok(serde_json::from_str(line)?)
}

/// The manifest of `dir`, taken by the host outside correx; `strict` adds mtimes and owners.
fn manifest(dir: &Path, strict: bool) -> Result<Manifest, Box<dyn std::error::Error>> {
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(dir.join(".manifest.py")).arg(dir);
    if strict {
        cmd.arg("strict");
    }
    let out = cmd.output()?;
    assert!(out.status.success(), "manifest: {out:?}");
    parse_manifest(&String::from_utf8_lossy(&out.stdout))
}

/// What changed from `before` to `after`, as the change set should say it, by relative path:
/// `added`, `deleted`, `modified` (content, target or type) or `mode_changed`.
fn expected(before: &Manifest, after: &Manifest) -> BTreeMap<String, &'static str> {
    let mut out = BTreeMap::new();
    for (p, a) in after {
        match before.get(p) {
            None => {
                out.insert(p.clone(), "added");
            }
            Some(b) if b[0] != a[0] || b[2] != a[2] => {
                out.insert(p.clone(), "modified");
            }
            Some(b) if b[1] != a[1] => {
                out.insert(p.clone(), "mode_changed");
            }
            Some(_) => {}
        }
    }
    for p in before.keys().filter(|p| !after.contains_key(*p)) {
        out.insert(p.clone(), "deleted");
    }
    out
}

/// Checks a run's change set (`data.workspace.changes`) against the manifests: every path
/// the manifests say changed is listed as that, and nothing else is listed but paths that
/// were only touched (rewritten the same) or replaced whole (a directory made again).
fn check_changes(work: &Path, changes: &Value, want: &BTreeMap<String, &'static str>, what: &str) {
    let mut listed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for c in changes.as_array().map(Vec::as_slice).unwrap_or_default() {
        let path = c["path"].as_str().unwrap_or_default();
        let rel = Path::new(path)
            .strip_prefix(work)
            .unwrap_or_else(|_| panic!("{what}: {path} is not in {}", work.display()));
        listed
            .entry(rel.display().to_string())
            .or_default()
            .insert(c["kind"].as_str().unwrap_or_default().to_owned());
    }
    for (p, kind) in want {
        let got = listed.get(p);
        let ok = match *kind {
            // A path deleted and made again is listed as both.
            "modified" => got.is_some_and(|k| {
                k.contains("modified") || (k.contains("deleted") && k.contains("added"))
            }),
            "mode_changed" => got.is_some_and(|k| {
                k.contains("mode_changed") || (k.contains("deleted") && k.contains("added"))
            }),
            k => got.is_some_and(|g| g.len() == 1 && g.contains(k)),
        };
        assert!(ok, "{what}: {p} is {kind}, the change set says {got:?}");
    }
    for (p, kinds) in &listed {
        if want.contains_key(p) {
            continue;
        }
        let unchanged_ok = kinds.iter().all(|k| k == "touched")
            || (kinds.contains("deleted") && kinds.contains("added") && kinds.len() == 2);
        assert!(
            unchanged_ok,
            "{what}: {p} is listed as {kinds:?} but did not change"
        );
    }
}

// ------------------------------------------------------------------ the project

struct Project {
    _dir: TempDir,
    work: PathBuf,
}

fn git(dir: &Path, args: &[&str]) -> TestResult {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .output()?;
    assert!(out.status.success(), "git {args:?}: {out:?}");
    Ok(())
}

/// A project under a 0700 directory, as containers and CI hold one: a git repository, a
/// local wheel, a Makefile and its source, a subtree, two directories, a script, a symlink.
fn project(tag: &str) -> Result<Project, Box<dyn std::error::Error>> {
    let dir = TempDir::new(tag);
    let base = std::fs::canonicalize(dir.path())?;
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700))?;
    let work = base.join("work");
    let w = |rel: &str| work.join(rel);
    for d in [
        "repo",
        "wheels",
        "src",
        "tree/sub/deep",
        "dirA/moved",
        "dirB",
    ] {
        std::fs::create_dir_all(w(d))?;
    }
    std::fs::write(w(".manifest.py"), MANIFEST_PY)?;
    std::fs::write(w("repo/a.txt"), "tracked\n")?;
    git(&w("repo"), &["init", "-q", "-b", "main"])?;
    git(&w("repo"), &["add", "a.txt"])?;
    git(&w("repo"), &["commit", "-q", "-m", "one"])?;
    write_wheel(&w("wheels"))?;
    std::fs::write(w("src/main.c"), "int main(void) { return 0; }\n")?;
    std::fs::write(
        w("Makefile"),
        "build/hello: src/main.c\n\tmkdir -p build\n\tcc -o build/hello src/main.c\n\techo built > build/stamp\n",
    )?;
    std::fs::write(w("tree/keep.txt"), "kept\n")?;
    std::fs::write(w("tree/sub/x.txt"), "x\n")?;
    std::fs::write(w("tree/sub/deep/y.txt"), "y\n")?;
    std::fs::write(w("dirA/f.txt"), "moving\n")?;
    std::fs::write(w("dirA/moved/g.txt"), "moving too\n")?;
    std::fs::write(w("script.sh"), "#!/bin/sh\necho hi\n")?;
    std::fs::set_permissions(w("script.sh"), std::fs::Permissions::from_mode(0o644))?;
    std::fs::write(w("a"), "target a\n")?;
    std::fs::write(w("b"), "target b\n")?;
    std::os::unix::fs::symlink("a", w("link"))?;
    std::fs::write(w("notes.txt"), "one\ntwo\nthree\n")?;
    Ok(Project { _dir: dir, work })
}

/// What each program does to the project, as one shell script run in the working dir.
const PROGRAMS: &[(&str, &str)] = &[
    (
        "git",
        "cd repo && git -c safe.directory='*' checkout -q -b x && echo two > b.txt \
         && git -c safe.directory='*' add b.txt && git -c safe.directory='*' commit -q -m two",
    ),
    (
        "pip",
        "python3 -m pip install -q --no-index --no-cache-dir --disable-pip-version-check \
         --find-links wheels --target site tinypkg",
    ),
    ("make", "make -s"),
    ("rm -rf", "rm -rf tree/sub"),
    ("mv", "mv dirA/f.txt dirB/f.txt && mv dirA/moved dirB/moved"),
    ("chmod", "chmod 755 script.sh && chmod 700 dirB"),
    ("symlink swap", "ln -sfn b link"),
    ("edit", "printf 'one\\n2\\nthree\\nfour\\n' > notes.txt"),
];

fn staged_shell(work: &Path, manual: bool) -> ShellTool {
    let o: ShellOptions = serde_json::from_value(json!({
        "allowed_executables": ["sh", "python3"],
        "working_dirs": [work],
        "timeout_ms": 120000,
        "workspace": "staged",
        "staging": { "promote": if manual { "manual" } else { "on_success" } },
        "env": {
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.com",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.com",
        },
    }))
    .expect("the shell's settings");
    let t = ShellTool::new(o).expect("the shell tool builds");
    assert_eq!(t.refusal(), None, "this kernel cannot confine the shell");
    t
}

fn run(tool: &ShellTool, work: &Path, script: &str) -> ToolResult {
    tool.execute(&request(work, script))
}

fn request(work: &Path, script: &str) -> ToolRequest {
    request_in("staged", work, script)
}

fn request_in(session: &str, work: &Path, script: &str) -> ToolRequest {
    let full = format!(
        "cd {w} && {{ {script} ; }} && python3 {w}/.manifest.py {w}",
        w = work.display()
    );
    ToolRequest::new(
        SessionId::from(session),
        "shell",
        json!({ "argv": ["sh", "-c", full] })
            .as_object()
            .cloned()
            .unwrap_or_default(),
    )
}

fn text(r: &ToolResult) -> String {
    match r {
        ToolResult::Success { output, .. } => output.clone(),
        ToolResult::Failure { reason, data, .. } => format!("(failed) {reason} {data:?}"),
    }
}

fn workspace(r: &ToolResult) -> Value {
    r.data().map(|d| d["workspace"].clone()).unwrap_or_default()
}

/// Every path of the real tree belongs to the working dir's owner (on a root host the run's
/// files were written as its own uid and given back when promoted).
fn owned_by_owner(work: &Path) -> TestResult {
    let owner = std::fs::metadata(work)?;
    let strict = manifest(work, true)?;
    for (p, e) in &strict {
        assert_eq!(
            (e[4].as_u64(), e[5].as_u64()),
            (Some(owner.uid() as u64), Some(owner.gid() as u64)),
            "{p} is not the working dir owner's"
        );
    }
    Ok(())
}

fn real_programs() -> TestResult {
    for (name, script) in PROGRAMS {
        let p = project("staged-programs")?;
        let before = manifest(&p.work, false)?;
        let strict = manifest(&p.work, true)?;

        // Held for the host: the run changed its view, the real tree did not change.
        let held = staged_shell(&p.work, true);
        let r = run(&held, &p.work, script);
        assert!(r.is_success(), "{name}: {}", text(&r));
        let seen = parse_manifest(&text(&r))?;
        let want = expected(&before, &seen);
        assert!(!want.is_empty(), "{name}: the program changed nothing");
        let ws = workspace(&r);
        assert_eq!(ws["state"], "kept", "{name}: {ws}");
        check_changes(&p.work, &ws["changes"], &want, name);
        assert_eq!(manifest(&p.work, true)?, strict, "{name}: the tree changed");
        // Read again through the tool, the same list.
        let inv = r.invocation_id().to_string();
        let ws_api = held.workspace().ok_or("no workspace")?;
        assert_eq!(
            ws_api.held(),
            vec![("staged".to_owned(), inv.clone())],
            "{name}"
        );
        let again = ws_api.changes(&inv)?;
        assert_eq!(
            again.changes.len(),
            ws["changes"].as_array().map_or(0, Vec::len),
            "{name}"
        );
        // Discarded: byte-identical, mtimes and owners too, and nothing held.
        ws_api.discard(&inv)?;
        assert!(ws_api.held().is_empty());
        assert_eq!(
            manifest(&p.work, true)?,
            strict,
            "{name}: discard changed the tree"
        );

        // Promoted on success: the tree is what the run saw.
        let t = staged_shell(&p.work, false);
        let r = run(&t, &p.work, script);
        assert!(r.is_success(), "{name}: {}", text(&r));
        let seen = parse_manifest(&text(&r))?;
        let ws = workspace(&r);
        assert_eq!(ws["state"], "promoted", "{name}: {ws}");
        check_changes(&p.work, &ws["changes"], &expected(&before, &seen), name);
        assert_eq!(manifest(&p.work, false)?, seen, "{name}: promoted tree");
        owned_by_owner(&p.work)?;
        // What the programs made works from the real tree.
        match *name {
            "git" => git(&p.work.join("repo"), &["log", "-q", "--oneline", "x"])?,
            "pip" => assert!(p.work.join("site/tinypkg.py").is_file()),
            "make" => {
                assert!(std::fs::read(p.work.join("build/hello"))?.starts_with(b"\x7fELF"))
            }
            _ => {}
        }
    }
    Ok(())
}

#[test]
fn real_programs_staged_are_seen_held_discarded_and_promoted_exactly() -> TestResult {
    both("real_programs", real_programs)
}

// ------------------------------------------------------------------ the diff

fn diff_of_a_text_file() -> TestResult {
    let p = project("staged-diff")?;
    let t = staged_shell(&p.work, true);
    let r = run(
        &t,
        &p.work,
        "printf 'one\\n2\\nthree\\nfour\\n' > notes.txt",
    );
    assert!(r.is_success(), "{}", text(&r));
    let ws = workspace(&r);
    let diff = ws["diff"].as_str().unwrap_or_default();
    let notes = p.work.join("notes.txt").display().to_string();
    for line in [
        format!("--- a{notes}"),
        format!("+++ b{notes}"),
        "-two".to_owned(),
        "+2".to_owned(),
        "+four".to_owned(),
        " one".to_owned(),
    ] {
        assert!(diff.lines().any(|l| l == line), "no {line:?} in:\n{diff}");
    }
    assert_eq!(ws["summary"]["modified"], 1, "{ws}");
    Ok(())
}

#[test]
fn the_change_set_carries_a_unified_diff_of_text_files() -> TestResult {
    both("diff", diff_of_a_text_file)
}

// ------------------------------------------------------------------ conflicts

/// The layer directory of invocation `inv` appears beneath the stage base once the run is
/// about to start.
fn wait_for_layer(inv: &str) {
    let base = std::env::temp_dir()
        .join(format!("correx-shell-{}", unsafe_euid()))
        .join("stage");
    for _ in 0..600 {
        let found = std::fs::read_dir(&base)
            .into_iter()
            .flatten()
            .flatten()
            .any(|tool| tool.path().join(inv).join("run.json").is_file());
        if found {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!(
        "the layer of {inv} never appeared beneath {}",
        base.display()
    );
}

fn unsafe_euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn conflict() -> TestResult {
    // Held, then the host edits a file the run edited: promote refuses, nothing applied.
    let p = project("staged-conflict")?;
    let t = staged_shell(&p.work, true);
    let r = run(&t, &p.work, "echo run > notes.txt && echo new > added.txt");
    assert!(r.is_success(), "{}", text(&r));
    let inv = r.invocation_id().to_string();
    std::fs::write(p.work.join("notes.txt"), "the host's\n")?;
    let before = manifest(&p.work, true)?;
    let ws = t.workspace().ok_or("no workspace")?;
    let e = ws
        .promote(&inv)
        .err()
        .ok_or("promoted over the host's edit")?;
    assert_eq!(e.kind(), "conflict", "{e}");
    let notes = p.work.join("notes.txt").display().to_string();
    assert!(e.to_string().contains(&notes), "{e}");
    assert_eq!(
        manifest(&p.work, true)?,
        before,
        "a refused promote changed the tree"
    );
    // Still held: the host may discard it.
    assert_eq!(ws.held().len(), 1);
    ws.discard(&inv)?;
    assert_eq!(manifest(&p.work, true)?, before);

    // On success, while the run runs: the run fails with kind conflict, naming the path.
    let t = staged_shell(&p.work, false);
    let req = request(
        &p.work,
        "echo run > notes.txt && echo new > added.txt && sleep 2",
    );
    let inv = req.invocation_id.to_string();
    let host = {
        let notes = p.work.join("notes.txt");
        std::thread::spawn(move || {
            wait_for_layer(&inv);
            // Past the filesystem clock's tick the run started in (see the known gaps).
            std::thread::sleep(Duration::from_millis(20));
            std::fs::write(notes, "the host's again\n")
        })
    };
    let r = t.execute(&req);
    host.join().map_err(|_| "host thread")??;
    let before = manifest(&p.work, true)?;
    match &r {
        ToolResult::Failure { kind, .. } => {
            assert_eq!(kind.as_str(), "conflict", "{}", text(&r))
        }
        _ => panic!("a conflicting run succeeded: {}", text(&r)),
    }
    let ws = workspace(&r);
    assert_eq!(ws["state"], "conflict", "{ws}");
    assert!(
        ws["conflicts"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["path"] == notes.as_str())),
        "{ws}"
    );
    assert!(!p.work.join("added.txt").exists(), "part of it was applied");
    assert_eq!(
        std::fs::read_to_string(p.work.join("notes.txt"))?,
        "the host's again\n"
    );
    assert_eq!(manifest(&p.work, true)?, before);
    Ok(())
}

#[test]
fn a_file_the_host_changed_meanwhile_is_a_conflict_and_nothing_is_applied() -> TestResult {
    both("conflict", conflict)
}

/// A change set held for the host outlives its tool: the next tool staging the same working
/// dirs lists it and may promote it; a tool staging other dirs on the same base does not.
fn held_outlives_its_tool() -> TestResult {
    let a = project("staged-held-a")?;
    let b = project("staged-held-b")?;
    let inv = {
        let t = staged_shell(&a.work, true);
        let r = run(&t, &a.work, "echo kept > kept.txt");
        assert_eq!(workspace(&r)["state"], "kept", "{}", text(&r));
        r.invocation_id().to_string()
    };
    let other = staged_shell(&b.work, true);
    let ws = other.workspace().ok_or("no workspace")?;
    assert!(ws.held().is_empty(), "a tool on other dirs took it over");
    let t = staged_shell(&a.work, true);
    let ws = t.workspace().ok_or("no workspace")?;
    assert_eq!(
        ws.held().iter().map(|h| h.1.as_str()).collect::<Vec<_>>(),
        [inv.as_str()]
    );
    assert!(!a.work.join("kept.txt").exists());
    assert!(ws.diff(&inv)?.contains("\n+kept\n"), "{}", ws.diff(&inv)?);
    ws.promote(&inv)?;
    assert_eq!(std::fs::read_to_string(a.work.join("kept.txt"))?, "kept\n");
    assert!(ws.held().is_empty());
    // The same invocation again while its change set is held: refused, saying why.
    let again = request(&a.work, "echo again > again.txt");
    assert_eq!(workspace(&t.execute(&again))["state"], "kept");
    let r = t.execute(&again);
    assert!(
        !r.is_success() && text(&r).contains("already has a change set held"),
        "{}",
        text(&r)
    );
    ws.discard(again.invocation_id.as_str())?;
    assert!(!a.work.join("again.txt").exists());

    // Held for dirs that are gone: the next tool on the base removes it (none can promote it).
    let c = project("staged-held-c")?;
    let inv = {
        let t = staged_shell(&c.work, true);
        let r = run(&t, &c.work, "echo kept > kept.txt");
        assert_eq!(workspace(&r)["state"], "kept", "{}", text(&r));
        r.invocation_id().to_string()
    };
    let layer_left = || {
        let base = std::env::temp_dir()
            .join(format!("correx-shell-{}", unsafe_euid()))
            .join("stage");
        std::fs::read_dir(base)
            .into_iter()
            .flatten()
            .flatten()
            .any(|tool| tool.path().join(&inv).exists())
    };
    assert!(layer_left(), "the held layer is not where this test looks");
    drop(staged_shell(&b.work, true));
    assert!(
        layer_left(),
        "a tool on other dirs removed a change set it could not promote"
    );
    std::fs::remove_dir_all(&c.work)?;
    drop(staged_shell(&b.work, true));
    assert!(
        !layer_left(),
        "a change set for dirs that are gone was left"
    );
    Ok(())
}

#[test]
fn a_held_change_set_passes_to_the_next_tool_on_the_same_dirs() -> TestResult {
    both("held", held_outlives_its_tool)
}

/// Through the runtime: the sandbox records the change set (`workspace.staged`) with the run,
/// the host promotes one and discards another (`workspace.settled`, by the host), and
/// `correx run diff` prints what the log says.
#[test]
fn the_runtime_records_staged_change_sets_and_the_hosts_decisions() -> TestResult {
    let p = project("staged-runtime")?;
    let db = p.work.parent().ok_or("no parent")?.join("events.db");
    let config = correx::RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": db,
            "sandbox_root": p.work.parent().ok_or("no parent")?.join("sandbox"),
            "tools": {"shell": {
                "enabled": true,
                "allowed_executables": ["sh", "python3"],
                "working_dirs": [&p.work],
                "workspace": "staged",
                "staging": {"promote": "manual"}
            }},
            "approvals": {"engine": "auto", "max_tier": 3}
        })
        .to_string(),
    )?;
    let rt = correx::Runtime::new(&config, std::sync::Arc::new(correx::DenyAll))?;
    let ex = rt.executor();
    let session = format!("runtime-{}", std::process::id());
    use correx::ToolExecutor;
    let first = ex.execute(&request_in(
        &session,
        &p.work,
        "echo one > notes.txt && echo new > added.txt",
    ));
    assert!(first.is_success(), "{}", text(&first));
    let second = ex.execute(&request_in(&session, &p.work, "rm -r tree"));
    assert!(second.is_success(), "{}", text(&second));
    let (one, two) = (
        first.invocation_id().to_string(),
        second.invocation_id().to_string(),
    );
    let held: Vec<String> = rt.staged().into_iter().map(|(_, _, i)| i).collect();
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(held.contains(&one) && held.contains(&two), "{held:?}");
    assert!(!p.work.join("added.txt").exists() && p.work.join("tree").is_dir());

    let diff = |inv: &str, json: bool| -> Result<String, Box<dyn std::error::Error>> {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_correx"));
        c.args(["run", "diff"]).arg(&db).arg(inv);
        if json {
            c.arg("--json");
        }
        let out = c.output()?;
        assert!(out.status.success(), "{out:?}");
        Ok(String::from_utf8(out.stdout)?)
    };
    let said = diff(&one, false)?;
    let added = p.work.join("added.txt").display().to_string();
    assert!(said.contains(&format!("A {added}")), "{said}");
    assert!(said.contains("kept"), "{said}");
    assert!(said.contains("-two"), "{said}");
    let recorded: Value = serde_json::from_str(&diff(&one, true)?)?;
    assert_eq!(recorded["state"], "kept", "{recorded}");
    assert_eq!(recorded["promote"], "manual", "{recorded}");

    let set = rt.promote_staged(&one)?;
    assert!(set
        .changes
        .iter()
        .any(|c| c.path == p.work.join("added.txt")));
    assert_eq!(std::fs::read_to_string(p.work.join("notes.txt"))?, "one\n");
    rt.discard_staged(&two)?;
    assert!(
        p.work.join("tree/sub/deep").is_dir(),
        "a discarded rm -r was applied"
    );
    assert!(rt.staged().is_empty());
    assert!(matches!(
        rt.promote_staged(&two),
        Err(correx::WorkspaceError::NotHeld { .. })
    ));
    let said = diff(&one, false)?;
    assert!(said.contains("then promoted by the host"), "{said}");
    let said = diff(&two, false)?;
    assert!(said.contains("then discarded by the host"), "{said}");
    // The promoted one taken back: the tree as before it, recorded.
    assert_eq!(
        rt.rewind_staged(&session, &one)?,
        std::slice::from_ref(&one)
    );
    assert!(!p.work.join("added.txt").exists());
    assert_eq!(
        std::fs::read_to_string(p.work.join("notes.txt"))?,
        "one\ntwo\nthree\n"
    );
    assert!(matches!(
        rt.rewind_staged(&session, &one),
        Err(correx::WorkspaceError::NotRewindable { .. })
    ));
    let settled: Vec<Value> = rt
        .events()
        .read_stream(&correx::session_stream(&session), 1, 1000)?
        .into_iter()
        .filter(|e| e.type_id == "workspace.settled")
        .map(|e| e.payload)
        .collect();
    assert_eq!(settled.len(), 3, "{settled:?}");
    assert_eq!(settled[0]["invocation_id"], one.as_str());
    assert_eq!(settled[0]["state"], "promoted");
    assert_eq!(settled[1]["state"], "discarded");
    assert_eq!(settled[2]["state"], "rewound");
    assert_eq!(settled[2]["invocation_id"], one.as_str());
    assert_eq!(settled[2]["summary"]["added"], 1, "{}", settled[2]);
    Ok(())
}

/// Rewind: three promoted steps of a session taken back, the last alone and then the rest,
/// leave the tree as it was after the second and then before the first; a path someone else
/// changed since refuses it with nothing changed.
fn rewind() -> TestResult {
    let p = project("staged-rewind")?;
    let session = format!("rewind-{}", std::process::id());
    let t = staged_shell(&p.work, false);
    let ws = t.workspace().ok_or("no workspace")?;
    let step = |script: &str| -> Result<String, Box<dyn std::error::Error>> {
        let r = t.execute(&request_in(&session, &p.work, script));
        assert_eq!(workspace(&r)["state"], "promoted", "{}", text(&r));
        Ok(r.invocation_id().to_string())
    };
    let before = manifest(&p.work, false)?;
    let one = step("echo one > notes.txt && echo new > added.txt && mkdir -p made/deep && echo x > made/deep/x")?;
    let two = step("rm -r tree && chmod 0700 src && rm added.txt")?;
    let after_two = manifest(&p.work, false)?;
    let three = step("mv dirA/moved dirB/ && ln -sfn notes.txt link && echo more >> notes.txt && echo x > made/deep/y")?;
    assert_ne!(manifest(&p.work, false)?, after_two);
    assert_eq!(
        ws.rewindable(&session),
        [one.clone(), two.clone(), three.clone()]
    );

    // Someone else makes a path the second step removed: refused, nothing changed.
    std::fs::create_dir(p.work.join("tree"))?;
    let now = manifest(&p.work, false)?;
    let e = ws
        .rewind(&session, &one)
        .err()
        .ok_or("rewound over the host's change")?;
    assert_eq!(e.kind(), "changed_since", "{e}");
    assert!(
        e.to_string()
            .contains(&p.work.join("tree").display().to_string()),
        "{e}"
    );
    assert_eq!(
        manifest(&p.work, false)?,
        now,
        "a refused rewind changed the tree"
    );
    std::fs::remove_dir(p.work.join("tree"))?;
    // ... or edits a file the third step placed: refused too, until it is put back.
    let notes = p.work.join("notes.txt");
    let (kept, mtime) = (
        std::fs::read(&notes)?,
        std::fs::metadata(&notes)?.modified()?,
    );
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&notes, "the host's\n")?;
    let e = ws
        .rewind(&session, &three)
        .err()
        .ok_or("rewound over the host's edit")?;
    assert!(e.to_string().contains("notes.txt was changed"), "{e}");
    assert_eq!(std::fs::read(&notes)?, b"the host's\n");
    std::fs::write(&notes, &kept)?;
    std::fs::File::options()
        .write(true)
        .open(&notes)?
        .set_modified(mtime)?;

    let rewound = ws.rewind(&session, &three)?;
    assert_eq!(
        rewound.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        [three.as_str()]
    );
    assert_eq!(
        manifest(&p.work, false)?,
        after_two,
        "rewinding the last step"
    );
    // A file the host made in a directory the first step made: taking the directory back
    // would take the file with it, so the rewind is refused.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(p.work.join("made/deep/host.txt"), "mine\n")?;
    let e = ws
        .rewind(&session, &one)
        .err()
        .ok_or("rewound over the host's new file")?;
    assert!(e.to_string().contains("made/deep/host.txt was made"), "{e}");
    assert_eq!(std::fs::read(p.work.join("made/deep/host.txt"))?, b"mine\n");
    std::fs::remove_file(p.work.join("made/deep/host.txt"))?;
    let rewound = ws.rewind(&session, &one)?;
    assert_eq!(
        rewound.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        [two.as_str(), one.as_str()]
    );
    assert_eq!(manifest(&p.work, false)?, before, "rewinding three steps");
    owned_by_owner(&p.work)?;
    assert!(ws.rewindable(&session).is_empty());
    let e = ws.rewind(&session, &one).err().ok_or("rewound twice")?;
    assert_eq!(e.kind(), "not_rewindable", "{e}");
    Ok(())
}

#[test]
fn rewinding_three_steps_restores_the_tree_before_the_first() -> TestResult {
    both("rewind", rewind)
}

// ------------------------------------------------------------------ failures and bounds

fn failed_and_too_large() -> TestResult {
    let p = project("staged-failed")?;
    let before = manifest(&p.work, true)?;
    let t = staged_shell(&p.work, false);
    // A failed run's changes are discarded: a half-done install stays out of the tree.
    let r = run(&t, &p.work, "rm -rf tree && echo half > half.txt && false");
    assert!(!r.is_success());
    let ws = workspace(&r);
    assert_eq!(ws["state"], "discarded", "{ws}");
    assert_eq!(manifest(&p.work, true)?, before);
    // A device node, FIFO or socket the run makes is listed, never promoted.
    let r = run(&t, &p.work, "mkfifo pipe && echo ok > ok.txt");
    let ws = workspace(&r);
    assert!(r.is_success(), "{}", text(&r));
    assert_eq!(ws["state"], "promoted", "{ws}");
    assert!(
        ws["changes"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["kind"] == "special")),
        "{ws}"
    );
    assert!(p.work.join("ok.txt").is_file());
    assert!(std::fs::symlink_metadata(p.work.join("pipe")).is_err());

    // A change set over the bound fails the run and is discarded.
    let mut o: ShellOptions = serde_json::from_value(json!({
        "allowed_executables": ["sh", "python3"],
        "working_dirs": [p.work],
        "workspace": "staged",
        "staging": { "max_run_bytes": 4096 },
    }))?;
    o.timeout = Duration::from_secs(60);
    let small = ShellTool::new(o)?;
    let before = manifest(&p.work, true)?;
    let r = run(&small, &p.work, "head -c 65536 /dev/zero > big.bin");
    match &r {
        ToolResult::Failure { kind, .. } => assert_eq!(kind.as_str(), "too_large", "{}", text(&r)),
        _ => panic!("an oversized change set was promoted: {}", text(&r)),
    }
    assert_eq!(manifest(&p.work, true)?, before);
    Ok(())
}

#[test]
fn a_failed_run_is_discarded_special_files_stay_out_and_the_bound_holds() -> TestResult {
    both("failed_and_too_large", failed_and_too_large)
}

// ------------------------------------------------------------------ both users

type Scenario = fn() -> TestResult;

const SCENARIOS: &[(&str, Scenario)] = &[
    ("real_programs", real_programs),
    ("diff", diff_of_a_text_file),
    ("conflict", conflict),
    ("held", held_outlives_its_tool),
    ("rewind", rewind),
    ("failed_and_too_large", failed_and_too_large),
    ("crashes", crashes_small),
];

/// Runs `scenario` here and, when we are root, again as nobody in a child test process.
fn both(name: &str, scenario: Scenario) -> TestResult {
    scenario()?;
    if !root() {
        return Ok(());
    }
    crate::util::assert_child_passes(
        child_test("staged::unprivileged_child").env("CORREX_CHILD_SCENARIO", name),
        "scenario passed",
        &format!("{name} as uid 65534"),
    )?;
    Ok(())
}

#[test]
#[ignore = "helper: run by the unprivileged variants"]
fn unprivileged_child() {
    if !is_child() {
        return;
    }
    let name = std::env::var("CORREX_CHILD_SCENARIO").expect("scenario name");
    crate::util::become_nobody();
    let (_, scenario) = SCENARIOS
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a known scenario");
    scenario().expect("the scenario");
    println!("scenario passed");
}

// ------------------------------------------------------------------ crashes

/// The crash tests' run: 300 files written, 100 rewritten, 100 removed, a directory moved.
/// Deterministic, so the tree it leaves is known before it runs.
const CRASH_SCRIPT: &str = "for i in $(seq 1 300); do echo new $i > new/$i.txt; done; \
     for i in $(seq 1 100); do echo changed $i > old/$i.txt; done; \
     for i in $(seq 101 200); do rm old/$i.txt; done; mv old/sub moved";

/// A project for the crash tests, with its own temp base (so its layers are the only ones
/// there): `tmp` is the TMPDIR of the child that runs and of the one that recovers.
struct CrashRig {
    dir: TempDir,
    work: PathBuf,
    tmp: PathBuf,
}

fn crash_rig() -> Result<CrashRig, Box<dyn std::error::Error>> {
    let dir = TempDir::new("staged-crash");
    let base = std::fs::canonicalize(dir.path())?;
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700))?;
    let work = base.join("work");
    let tmp = base.join("tmp");
    std::fs::create_dir_all(work.join("new"))?;
    std::fs::create_dir_all(work.join("old/sub"))?;
    std::fs::create_dir_all(&tmp)?;
    std::fs::write(work.join(".manifest.py"), MANIFEST_PY)?;
    for i in 1..=200 {
        std::fs::write(work.join(format!("old/{i}.txt")), format!("old {i}\n"))?;
    }
    std::fs::write(work.join("old/sub/s.txt"), "sub\n")?;
    Ok(CrashRig { dir, work, tmp })
}

/// The tree before the crash run and after it, done by the host outside correx in a copy.
fn two_states(rig: &CrashRig) -> Result<(Manifest, Manifest), Box<dyn std::error::Error>> {
    let before = manifest(&rig.work, false)?;
    let copy = rig.dir.path().join("copy");
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg(&rig.work)
        .arg(&copy)
        .output()?;
    assert!(out.status.success(), "{out:?}");
    let out = std::process::Command::new("sh")
        .args(["-c", CRASH_SCRIPT])
        .current_dir(&copy)
        .output()?;
    assert!(out.status.success(), "{out:?}");
    let after = manifest(&copy, false)?;
    std::fs::remove_dir_all(&copy)?;
    Ok((before, after))
}

/// Helper for the crash tests: with `CORREX_CHILD_RECOVER` set, opens the staged tool and runs
/// it once (which settles what a dead one left) and says what is left beneath the stage base; else runs the
/// crash script staged (on_success), which the parent kills or `CORREX_TEST_ABORT_AT` aborts.
#[test]
#[ignore = "helper: run by the crash tests"]
fn child_staged_run() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    let work = PathBuf::from(std::env::var("CORREX_CHILD_DIR")?);
    let t = staged_shell(&work, false);
    if std::env::var_os("CORREX_CHILD_RECOVER").is_some() {
        // A tool settles what was busy when it opened before its next run.
        let r = t.execute(&ToolRequest::new(
            SessionId::from("staged"),
            "shell",
            json!({ "argv": ["sh", "-c", "exit 0"] })
                .as_object()
                .cloned()
                .unwrap_or_default(),
        ));
        assert!(r.is_success(), "{}", text(&r));
        let base = std::env::temp_dir()
            .join(format!("correx-shell-{}", unsafe_euid()))
            .join("stage");
        let left: Vec<String> = std::fs::read_dir(&base)?
            .flatten()
            .filter(|d| d.file_name() != "history")
            .flat_map(|tool| {
                std::fs::read_dir(tool.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|l| l.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|l| l.path().display().to_string())
                    .collect::<Vec<_>>()
            })
            .collect();
        println!("LEFT {}", left.len());
        for l in left {
            println!("  {l}");
        }
        return Ok(());
    }
    println!("READY");
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let r = run(&t, &work, CRASH_SCRIPT);
    println!("DONE {} {}", workspace(&r)["state"], text(&r));
    if std::env::var_os("CORREX_CHILD_REWIND").is_some() {
        let ws = t.workspace().ok_or("no workspace")?;
        let rewound = ws.rewind("staged", r.invocation_id().as_str())?;
        println!("REWOUND {}", rewound.len());
    }
    Ok(())
}

/// A crash child: it runs as this process does (as nobody in the unprivileged variant).
fn crash_child(rig: &CrashRig) -> std::process::Command {
    let mut c = child_test("staged::child_staged_run");
    c.env("CORREX_CHILD_DIR", &rig.work).env("TMPDIR", &rig.tmp);
    c
}

/// After a crash: recovery by the next tool on the base, then the tree is one of the two
/// states and no layer is left.
fn check_after_crash(
    rig: &CrashRig,
    states: &(Manifest, Manifest),
    what: &str,
) -> Result<bool, Box<dyn std::error::Error>> {
    let out = crash_child(rig).env("CORREX_CHILD_RECOVER", "1").output()?;
    let said = crate::util::both_streams(&out);
    assert!(out.status.success(), "{what}: recovery: {said}");
    assert!(said.contains("LEFT 0"), "{what}: layers left: {said}");
    let now = manifest(&rig.work, false)?;
    let promoted = now == states.1;
    assert!(
        promoted || now == states.0,
        "{what}: the tree is neither as it was nor as the run left it: {:?}",
        expected(&states.0, &now).len()
    );
    Ok(promoted)
}

/// Back to the state before the run, for the next round (a host-side restore: remove what
/// the run made, put back what it removed).
fn reset(rig: &CrashRig) -> TestResult {
    for d in ["new", "old", "moved"] {
        let p = rig.work.join(d);
        if p.exists() {
            std::fs::remove_dir_all(&p)?;
        }
    }
    std::fs::create_dir_all(rig.work.join("new"))?;
    std::fs::create_dir_all(rig.work.join("old/sub"))?;
    for i in 1..=200 {
        std::fs::write(rig.work.join(format!("old/{i}.txt")), format!("old {i}\n"))?;
    }
    std::fs::write(rig.work.join("old/sub/s.txt"), "sub\n")?;
    Ok(())
}

/// Aborted at each seam of a run's end, then killed `kills` times at random moments.
fn crashes(kills: usize) -> TestResult {
    let rig = crash_rig()?;
    let states = two_states(&rig)?;
    assert_ne!(states.0, states.1);
    // Each seam, by the test hook: before the journal, after it, mid-apply, after it.
    for (step, promoted) in [
        ("staged", Some(false)),
        ("journaled", Some(false)),
        ("applying", Some(false)),
        ("promoted", Some(true)),
    ] {
        let out = crash_child(&rig)
            .env("CORREX_TEST_ABORT_AT", step)
            .output()?;
        assert!(
            !out.status.success(),
            "{step}: the child was not aborted: {}",
            crate::util::both_streams(&out)
        );
        let got = check_after_crash(&rig, &states, step)?;
        if let Some(want) = promoted {
            assert_eq!(got, want, "{step}");
        }
        reset(&rig)?;
        assert_eq!(manifest(&rig.work, false)?, states.0);
    }
    // A rewind cut short after its mark: the next tool finishes it.
    let history = rig.tmp.join(format!(
        "correx-shell-{}/stage/history/staged",
        unsafe_euid()
    ));
    let kept = || {
        std::fs::read_dir(&history)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .count()
    };
    let kept_before = kept();
    let out = crash_child(&rig)
        .env("CORREX_CHILD_REWIND", "1")
        .env("CORREX_TEST_ABORT_AT", "rewinding")
        .output()?;
    let said = crate::util::both_streams(&out);
    assert!(
        said.contains("DONE \"promoted\"") && !out.status.success(),
        "{said}"
    );
    assert!(
        !check_after_crash(&rig, &states, "rewinding")?,
        "the rewind was not finished"
    );
    assert_eq!(
        kept(),
        kept_before,
        "a rewound layer was left in {}",
        history.display()
    );
    // A whole run, to know how long one takes.
    let t0 = std::time::Instant::now();
    let out = crash_child(&rig).output()?;
    let whole = t0.elapsed();
    let said = crate::util::both_streams(&out);
    assert!(said.contains("DONE \"promoted\""), "{said}");
    assert!(check_after_crash(&rig, &states, "whole run")?);
    reset(&rig)?;
    // SIGKILL at random moments from READY to the end.
    let mut seed = u64::from(std::process::id()) ^ 0x9e37_79b9_7f4a_7c15;
    let (mut promoted, mut before) = (0, 0);
    for round in 0..kills {
        let mut child = crash_child(&rig)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = std::io::BufReader::new(stdout).lines();
        for line in lines.by_ref() {
            if line?.contains("READY") {
                break;
            }
        }
        let drain = std::thread::spawn(move || lines.for_each(drop));
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let at = whole.mul_f64((seed >> 11) as f64 / (1u64 << 53) as f64);
        std::thread::sleep(at);
        let _ = child.kill();
        let _ = child.wait();
        let _ = drain.join();
        let what = format!("kill {round} at {at:?}");
        if check_after_crash(&rig, &states, &what)? {
            promoted += 1;
        } else {
            before += 1;
        }
        reset(&rig)?;
    }
    eprintln!("{kills} kills: {before} left the tree as it was, {promoted} promoted");
    Ok(())
}

fn crashes_small() -> TestResult {
    crashes(40)
}

#[test]
fn a_host_killed_at_any_point_of_a_run_or_promote_leaves_one_of_two_trees() -> TestResult {
    crashes(200)?;
    if root() {
        crate::util::assert_child_passes(
            child_test("staged::unprivileged_child").env("CORREX_CHILD_SCENARIO", "crashes"),
            "scenario passed",
            "crashes as uid 65534",
        )?;
    }
    Ok(())
}

/// Settings a staged shell cannot work with are config errors naming the field and why.
#[test]
fn staged_settings_it_cannot_work_with_are_config_errors() {
    let shell = |extra: Value| {
        let mut s = json!({"enabled": true, "allowed_executables": ["sh"],
                           "working_dirs": ["/tmp/a"], "workspace": "staged"});
        if let (Some(s), Some(e)) = (s.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        let config = json!({"v": 1, "event_log": "/tmp/x.db", "tools": {"shell": s}});
        match correx::RuntimeConfig::from_json(&config.to_string()) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    };
    for (extra, field, why) in [
        (
            json!({"isolation": {"mode": "none"}}),
            "tools.shell.workspace",
            "confined run",
        ),
        (
            json!({"working_dirs": []}),
            "tools.shell.workspace",
            "needs working_dirs",
        ),
        (
            json!({"working_dirs": ["/tmp/a", "/tmp/a/b"]}),
            "tools.shell.working_dirs",
            "nest",
        ),
        (
            json!({"staging": {"max_run_bytes": 0}}),
            "max_run_bytes",
            "",
        ),
        (
            json!({"staging": {"promote": "sometimes"}}),
            "promote",
            "sometimes",
        ),
        (json!({"staging": {"bound": 1}}), "bound", ""),
        (json!({"staging": ["manual"]}), "staging", ""),
        (json!({"workspace": "copied"}), "workspace", "copied"),
    ] {
        let e = shell(extra.clone());
        assert!(!e.is_empty(), "{extra} was taken");
        assert!(e.contains(field) && e.contains(why), "{extra}: {e}");
    }
    assert_eq!(shell(json!({})), "", "a good staged shell was refused");
}

// ------------------------------------------------------------------ a durable step cut short

/// A runtime over `base` (its log, sandbox root and the project `base/work`), whose shell is
/// staged and promotes on success.
fn staged_runtime(base: &Path) -> Result<correx::Runtime, Box<dyn std::error::Error>> {
    let config = correx::RuntimeConfig::from_json(
        &json!({
            "v": 1,
            "event_log": base.join("events.db"),
            "sandbox_root": base.join("sandbox"),
            "tools": {"shell": {
                "enabled": true,
                "allowed_executables": ["sh", "python3", "sleep"],
                "working_dirs": [base.join("work")],
                "workspace": "staged"
            }},
            "approvals": {"engine": "auto", "max_tier": 3}
        })
        .to_string(),
    )?;
    Ok(correx::Runtime::new(
        &config,
        std::sync::Arc::new(correx::DenyAll),
    )?)
}

const SESSION_SCRIPT: &str = "echo half > half.txt && rm -r tree && sleep 30";

/// Helper of the durable-step test: runs step `k1` of session `cut` (a staged run that
/// sleeps) until it is killed.
#[test]
#[ignore = "helper: run by the durable-step test"]
fn child_session_step() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    let base = PathBuf::from(std::env::var("CORREX_CHILD_DIR")?);
    let rt = staged_runtime(&base)?;
    let s = rt.session("cut")?;
    let req = request_in("cut", &base.join("work"), SESSION_SCRIPT);
    println!("INV {}", req.invocation_id);
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let r = s.execute("k1", rt.executor(), &req, None, &correx::CancelToken::new())?;
    println!("DONE {}", text(&r.value));
    Ok(())
}

/// Whether the lock of the tool directory holding `inv`'s layer is free (its host and every
/// process of it gone); true when there is no such layer.
fn layer_lock_free(inv: &str) -> bool {
    use std::os::fd::AsRawFd;
    let base = std::env::temp_dir()
        .join(format!("correx-shell-{}", unsafe_euid()))
        .join("stage");
    let tools = std::fs::read_dir(base).into_iter().flatten().flatten();
    for tool in tools.filter(|t| t.path().join(inv).is_dir()) {
        let Ok(f) = std::fs::File::open(tool.path().join("lock")) else {
            continue;
        };
        // SAFETY: flock on a descriptor this function owns; the lock goes with it.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return false;
        }
    }
    true
}

/// A durable session step whose host is killed while its staged run runs: the next runtime
/// discards the layer (the tree is as it was), records it, and the step resumed says so
/// (`state: "unchanged"`, not `unknown`) without running again.
#[test]
fn a_staged_step_cut_short_by_a_crash_says_its_working_dirs_are_unchanged() -> TestResult {
    let p = project("staged-session")?;
    let base = p.work.parent().ok_or("no parent")?.to_path_buf();
    let before = manifest(&p.work, false)?;
    let mut child = child_test("staged::child_session_step")
        .env("CORREX_CHILD_DIR", &base)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = std::io::BufReader::new(stdout).lines();
    let inv = lines
        .by_ref()
        .find_map(|l| Some(l.ok()?.split_once("INV ")?.1.trim().to_owned()))
        .ok_or("the child said no invocation")?;
    wait_for_layer(&inv);
    std::thread::sleep(Duration::from_millis(300));
    child.kill()?;
    child.wait()?;
    for _ in 0..500 {
        if layer_lock_free(&inv) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    let rt = staged_runtime(&base)?;
    assert_eq!(
        manifest(&p.work, false)?,
        before,
        "the cut-short run changed the tree"
    );
    let s = rt.session("cut")?;
    let req = request_in("cut", &p.work, SESSION_SCRIPT);
    let step = s.execute("k1", rt.executor(), &req, None, &correx::CancelToken::new())?;
    let r = &step.value;
    assert!(!r.is_success(), "{}", text(r));
    let data = r.data().cloned().unwrap_or_default();
    assert_eq!(data["state"], "unchanged", "{}: {data}", text(r));
    assert!(text(r).contains("discarded"), "{}", text(r));
    assert_eq!(manifest(&p.work, false)?, before, "the step ran again");
    let settled = rt
        .events()
        .read_stream(&correx::session_stream("cut"), 1, 1000)?
        .into_iter()
        .filter(|e| e.type_id == "workspace.settled")
        .map(|e| e.payload)
        .collect::<Vec<_>>();
    assert!(
        settled.iter().any(|e| e["invocation_id"] == inv.as_str()
            && e["by"] == "recovery"
            && e["state"] == "discarded"),
        "{settled:?}"
    );
    Ok(())
}
