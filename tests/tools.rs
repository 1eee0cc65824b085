use crate::util::{child_test, is_child, TempDir};
use correx::{
    FileAffectingTool, FileEditTool, FileReadTool, FileWriteTool, ResolveMode, Roots, SessionId,
    ShellOptions, ShellTool, Tool, ToolError, ToolRegistry, ToolRequest, ToolResult,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn req(tool: &str, params: Value) -> ToolRequest {
    ToolRequest::new(
        SessionId::from("test"),
        tool,
        params.as_object().cloned().unwrap_or_default(),
    )
}

fn shell(allowed: &[&str]) -> Result<ShellTool, ToolError> {
    ShellTool::new(ShellOptions {
        allowed_executables: allowed.iter().map(|s| (*s).to_owned()).collect(),
        ..ShellOptions::default()
    })
}

fn failure_reason(r: &ToolResult) -> Option<&str> {
    match r {
        ToolResult::Failure { reason, .. } => Some(reason),
        ToolResult::Success { .. } => None,
    }
}

fn output(r: &ToolResult) -> Option<&str> {
    match r {
        ToolResult::Success { output, .. } => Some(output),
        ToolResult::Failure { .. } => None,
    }
}

/// Processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                if cmd.contains(marker) {
                    found.push(cmd);
                }
            }
        }
    }
    found
}

// ---------------------------------------------------------------- shell

#[test]
fn shell_with_empty_allowlist_denies_everything_before_spawning() -> TestResult {
    let dir = TempDir::new("shell-empty");
    let marker = dir.join("made");
    let tool = shell(&[])?;
    let r = tool.execute(&req("shell", json!({"argv": ["touch", marker]})));
    assert!(!r.is_success());
    assert!(matches!(
        r,
        ToolResult::Failure {
            recoverable: false,
            ..
        }
    ));
    assert!(!marker.exists(), "a denied command ran");
    Ok(())
}

#[test]
fn shell_allowlist_is_by_resolved_path_not_by_name() -> TestResult {
    let dir = TempDir::new("shell-path");
    let tool = shell(&["ls"])?;
    assert!(tool
        .execute(&req("shell", json!({"argv": ["ls", "/usr"]})))
        .is_success());
    assert!(tool
        .execute(&req("shell", json!({"argv": ["/usr/bin/ls", "/usr"]})))
        .is_success());
    // Another binary that happens to be called ls.
    let fake = dir.join("ls");
    std::fs::copy("/usr/bin/touch", &fake)?;
    let marker = dir.join("made");
    let r = tool.execute(&req("shell", json!({"argv": [fake, marker]})));
    assert!(!r.is_success());
    assert!(!marker.exists());
    let r = tool.execute(&req("shell", json!({"argv": ["./ls"]})));
    assert!(failure_reason(&r).is_some_and(|m| m.contains("not an allowed executable")));
    let r = tool.execute(&req("shell", json!({"argv": ["touch", marker]})));
    assert!(!r.is_success() && !marker.exists());
    // The same file under another name: multi-call binaries act on argv[0], so it is refused.
    let alias = dir.join("sh");
    symlink("/usr/bin/ls", &alias)?;
    let r = tool.execute(&req("shell", json!({"argv": [alias, "/"]})));
    assert!(!r.is_success(), "an alias of an allowed binary ran");
    Ok(())
}

#[test]
fn shell_rejects_malformed_argv_with_a_clear_reason() -> TestResult {
    let tool = shell(&["ls"])?;
    for (params, want) in [
        (json!({}), "missing required parameter \"argv\""),
        (json!({"argv": "ls -l"}), "must be an array"),
        (json!({"argv": []}), "is empty"),
        (json!({"argv": ["ls", 3]}), "argv[1] must be a string"),
    ] {
        let r = tool.execute(&req("shell", params));
        let reason = failure_reason(&r).ok_or("expected a failure")?;
        assert!(reason.contains(want), "{reason}");
    }
    Ok(())
}

#[test]
fn shell_non_zero_exit_is_a_failure_with_stderr() -> TestResult {
    let tool = shell(&["ls"])?;
    let r = tool.execute(&req(
        "shell",
        json!({"argv": ["ls", "/definitely/not/here"]}),
    ));
    let reason = failure_reason(&r).ok_or("expected a failure")?;
    assert!(reason.contains("No such file"), "{reason}");
    assert!(reason.contains("exit code 2"), "{reason}");
    Ok(())
}

#[test]
fn shell_child_sees_a_cleared_environment() -> TestResult {
    std::env::set_var("CORREX_TEST_SECRET", "hunter2");
    let tool = ShellTool::new(ShellOptions {
        allowed_executables: vec!["env".into()],
        env: BTreeMap::from([("LANG".to_owned(), "C.UTF-8".to_owned())]),
        ..ShellOptions::default()
    })?;
    let r = tool.execute(&req("shell", json!({"argv": ["env"]})));
    let out = output(&r).ok_or("env failed")?;
    assert!(!out.contains("hunter2") && !out.contains("CORREX_TEST_SECRET"));
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    // TMPDIR is the run's private temp directory.
    let tmp = lines.pop().unwrap_or_default();
    assert!(
        tmp.starts_with("TMPDIR=/") && tmp.contains("correx-shell-"),
        "{tmp}"
    );
    assert_eq!(
        lines,
        vec!["LANG=C.UTF-8", "PATH=/usr/local/bin:/usr/bin:/bin"]
    );
    Ok(())
}

#[test]
fn shell_refuses_secret_looking_variables_unless_forced() -> TestResult {
    for name in ["OPENAI_API_KEY", "GITHUB_TOKEN", "db_password", "MY_SECRET"] {
        let r = ShellTool::new(ShellOptions {
            env: BTreeMap::from([(name.to_owned(), "x".to_owned())]),
            ..ShellOptions::default()
        });
        assert!(matches!(r, Err(ToolError::SecretEnvVar { .. })), "{name}");
    }
    let tool = ShellTool::new(ShellOptions {
        allowed_executables: vec!["env".into()],
        env: BTreeMap::from([("GITHUB_TOKEN".to_owned(), "t0k".to_owned())]),
        force_secret_env: true,
        ..ShellOptions::default()
    })?;
    let r = tool.execute(&req("shell", json!({"argv": ["env"]})));
    assert!(output(&r).is_some_and(|o| o.contains("GITHUB_TOKEN=t0k")));
    Ok(())
}

#[test]
fn shell_unknown_allowed_executable_fails_at_construction() {
    let r = shell(&["definitely-not-a-real-binary-xyz"]);
    assert!(matches!(r, Err(ToolError::ExecutableNotFound { .. })));
}

#[test]
fn shell_timeout_kills_grandchildren() -> TestResult {
    let tool = ShellTool::new(ShellOptions {
        allowed_executables: vec!["sh".into()],
        timeout: Duration::from_millis(300),
        ..ShellOptions::default()
    })?;
    let marker = "417.123";
    let started = std::time::Instant::now();
    let r = tool.execute(&req(
        "shell",
        json!({"argv": ["sh", "-c", format!("sleep {marker} & sleep {marker}")]}),
    ));
    let reason = failure_reason(&r).ok_or("expected a timeout failure")?;
    assert!(reason.contains("timed out"), "{reason}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // The group was SIGKILLed before execute returned; give the kernel a moment to reap.
    for _ in 0..50 {
        if processes_with(marker).is_empty() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("left behind: {:?}", processes_with(marker)).into())
}

#[test]
fn shell_background_children_do_not_outlive_a_successful_run() -> TestResult {
    let tool = shell(&["sh"])?;
    let marker = "418.321";
    let r = tool.execute(&req(
        "shell",
        json!({"argv": ["sh", "-c", format!("sleep {marker} > /dev/null 2>&1 & echo started")]}),
    ));
    assert_eq!(output(&r).map(str::trim), Some("started"));
    for _ in 0..50 {
        if processes_with(marker).is_empty() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("left behind: {:?}", processes_with(marker)).into())
}

#[test]
fn shell_cwd_must_lie_inside_a_working_root() -> TestResult {
    let dir = TempDir::new("shell-cwd");
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("sub"))?;
    symlink("/etc", root.join("etc_link"))?;
    let tool = ShellTool::new(ShellOptions {
        allowed_executables: vec!["pwd".into()],
        working_roots: vec![root.clone()],
        ..ShellOptions::default()
    })?;
    let r = tool.execute(&req("shell", json!({"argv": ["pwd"], "cwd": "sub"})));
    let want = std::fs::canonicalize(root.join("sub"))?;
    assert_eq!(
        output(&r).map(str::trim),
        Some(want.to_str().ok_or("utf8")?)
    );
    for bad in ["/etc", "etc_link", "../", "/tmp"] {
        let r = tool.execute(&req("shell", json!({"argv": ["pwd"], "cwd": bad})));
        assert!(!r.is_success(), "cwd {bad} was allowed");
    }
    Ok(())
}

/// Helper run in a child process: floods the shell tool's pipes and reports peak memory.
#[test]
#[ignore = "helper: run by shell_output_bomb_leaves_memory_bounded_by_the_cap"]
fn child_output_bomb() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    let tool = ShellTool::new(ShellOptions {
        allowed_executables: vec!["head".into(), "yes".into()],
        timeout: Duration::from_secs(2),
        ..ShellOptions::default()
    })?;
    let r = tool.execute(&req(
        "shell",
        json!({"argv": ["head", "-c", "1073741824", "/dev/zero"]}),
    ));
    let ToolResult::Success {
        output, metadata, ..
    } = r
    else {
        return Err(format!("head failed: {r:?}").into());
    };
    assert_eq!(
        metadata.get("stdout_truncated").map(String::as_str),
        Some("true")
    );
    assert!(output.len() < correx::DEFAULT_OUTPUT_CAP + 200);
    assert!(output.ends_with(&format!(
        "[output truncated: {} more bytes dropped]",
        (1u64 << 30) - correx::DEFAULT_OUTPUT_CAP as u64
    )));
    let r = tool.execute(&req("shell", json!({"argv": ["yes"]})));
    assert!(failure_reason(&r).is_some_and(|m| m.contains("timed out")));
    let status = std::fs::read_to_string("/proc/self/status")?;
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .ok_or("no VmHWM")?;
    println!("CHILD_{hwm}");
    Ok(())
}

#[test]
fn shell_output_bomb_leaves_memory_bounded_by_the_cap() -> TestResult {
    let out = child_test("tools::child_output_bomb").output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // libtest prints "test name ... " on the same line before the child's own output.
    let after = stdout
        .split("CHILD_VmHWM:")
        .nth(1)
        .ok_or_else(|| format!("child printed no VmHWM: {stdout}"))?;
    let kb: u64 = after
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    // The test binary itself takes some memory; a leak of the 1 GiB would be far above this.
    assert!(kb < 96 * 1024, "peak RSS {kb} kB after a 1 GiB output");
    Ok(())
}

// ---------------------------------------------------------------- file tools

struct Tree {
    _tmp: TempDir,
    root: PathBuf,
    outside: PathBuf,
}

/// root/ with files, subdirs and every kind of link; outside/ holds the secret.
fn tree() -> Result<Tree, Box<dyn std::error::Error>> {
    let tmp = TempDir::new("tree");
    let root = tmp.join("root");
    let outside = tmp.join("outside");
    std::fs::create_dir_all(root.join("sub"))?;
    std::fs::create_dir_all(&outside)?;
    std::fs::write(outside.join("secret.txt"), "SECRET")?;
    std::fs::write(outside.join("hard_out.txt"), "shared")?;
    std::fs::write(root.join("file.txt"), "inside")?;
    std::fs::write(root.join("sub/inner.txt"), "inner")?;
    std::fs::hard_link(outside.join("hard_out.txt"), root.join("hard.txt"))?;
    let links: &[(&str, String)] = &[
        ("link_in", "file.txt".into()),
        ("link_sub", "sub".into()),
        ("link_up", "../outside/secret.txt".into()),
        ("link_abs", outside.join("secret.txt").display().to_string()),
        (
            "link_abs_inside",
            root.join("file.txt").display().to_string(),
        ),
        ("dangling", "nothing-here".into()),
        ("chain1", "chain2".into()),
        ("chain2", "file.txt".into()),
        ("chain_out1", "chain_out2".into()),
        ("chain_out2", "../outside/secret.txt".into()),
        ("loop1", "loop2".into()),
        ("loop2", "loop1".into()),
        ("sub/up_link", "../file.txt".into()),
        ("sub/up2", "../../outside/secret.txt".into()),
        ("link_dir_out", "../outside".into()),
        ("magic", "/proc/self/root/etc/passwd".into()),
        ("fd_link", "/proc/self/fd/0".into()),
        ("link_to_root", ".".into()),
        ("link_to_parent", "..".into()),
        // A target ending in "/" asks for a directory, wherever it is spliced in.
        ("link_slash", "file.txt/".into()),
        ("link_sub_slash", "sub/".into()),
        ("link_chain_slash", "link_in/".into()),
    ];
    for (name, target) in links {
        symlink(target, root.join(name))?;
    }
    Ok(Tree {
        _tmp: tmp,
        root,
        outside,
    })
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Want {
    Allow,
    Refuse,
}

fn traversal_cases(t: &Tree) -> Vec<(&'static str, String, Want)> {
    let r = t.root.display().to_string();
    let o = t.outside.display().to_string();
    use Want::*;
    vec![
        ("read", "file.txt".into(), Allow),
        ("read", "./file.txt".into(), Allow),
        ("read", "sub/inner.txt".into(), Allow),
        ("read", "sub/./inner.txt".into(), Allow),
        ("read", "sub/../file.txt".into(), Allow),
        ("read", "../outside/secret.txt".into(), Refuse),
        ("read", "sub/../../outside/secret.txt".into(), Refuse),
        ("read", "link_in".into(), Allow),
        ("read", "link_sub/inner.txt".into(), Allow),
        ("read", "link_up".into(), Refuse),
        ("read", "link_abs".into(), Refuse),
        ("read", "link_abs_inside".into(), Refuse),
        ("read", "chain1".into(), Allow),
        ("read", "chain_out1".into(), Refuse),
        ("read", "loop1".into(), Refuse),
        ("read", "sub/up_link".into(), Allow),
        ("read", "sub/up2".into(), Refuse),
        ("read", "link_dir_out/secret.txt".into(), Refuse),
        ("read", "magic".into(), Refuse),
        ("read", "fd_link".into(), Refuse),
        ("read", "/proc/self/fd/0".into(), Refuse),
        ("read", "/proc/self/root/etc/passwd".into(), Refuse),
        ("read", format!("{r}/file.txt"), Allow),
        ("read", format!("{r}/sub/../file.txt"), Allow),
        ("read", format!("{r}/../outside/secret.txt"), Refuse),
        ("read", format!("{o}/secret.txt"), Refuse),
        ("read", "../root/file.txt".into(), Refuse),
        ("read", format!("{r}/../root/file.txt"), Refuse),
        ("read", "link_sub/../file.txt".into(), Allow),
        ("read", "link_sub/../../outside/secret.txt".into(), Refuse),
        ("read", "dangling".into(), Refuse),
        ("read", "".into(), Refuse),
        ("read", "hard.txt".into(), Allow),
        ("read", "/etc/passwd".into(), Refuse),
        ("read", "link_to_root/file.txt".into(), Allow),
        ("read", "link_to_parent/outside/secret.txt".into(), Refuse),
        (
            "read",
            "link_to_root/link_to_parent/outside/secret.txt".into(),
            Refuse,
        ),
        ("read", "sub".into(), Refuse),
        // A trailing "/" or "/." asks for a directory, as openat2 reads it.
        ("read", "file.txt/".into(), Refuse),
        ("read", "file.txt/.".into(), Refuse),
        ("read", "sub/inner.txt/".into(), Refuse),
        ("read", "link_in/".into(), Refuse),
        ("read", "link_slash".into(), Refuse),
        ("read", "link_chain_slash".into(), Refuse),
        ("list", "link_sub_slash".into(), Allow),
        ("read", "link_sub_slash/inner.txt".into(), Allow),
        ("list", "sub/".into(), Allow),
        ("list", "sub/.".into(), Allow),
        ("list", "link_sub/".into(), Allow),
        ("list", "sub".into(), Allow),
        ("list", ".".into(), Allow),
        ("list", "link_dir_out".into(), Refuse),
        ("list", "link_to_parent".into(), Refuse),
        ("list", "..".into(), Refuse),
        ("exists", "../outside/secret.txt".into(), Refuse),
        ("exists", "../outside/not-there".into(), Refuse),
        ("exists", "link_up".into(), Refuse),
        ("exists", "link_dir_out/not-there".into(), Refuse),
        ("write", "new.txt".into(), Allow),
        ("write", "sub/../new3.txt".into(), Allow),
        ("write", "link_sub/new2.txt".into(), Allow),
        ("write", "dangling".into(), Refuse),
        ("write", "link_in".into(), Refuse),
        ("write", "hard.txt".into(), Refuse),
        ("write", "../outside/new.txt".into(), Refuse),
        ("write", "link_dir_out/new.txt".into(), Refuse),
        ("write", "link_to_parent/outside/new.txt".into(), Refuse),
        ("write", format!("{o}/new.txt"), Refuse),
        ("write", r.clone(), Refuse),
        ("write", "sub".into(), Refuse),
        ("write", "sub/..".into(), Refuse),
        ("delete", "link_up".into(), Allow),
        ("delete", "../outside/secret.txt".into(), Refuse),
        ("delete", "link_dir_out/secret.txt".into(), Refuse),
    ]
}

fn run_case(read: &FileReadTool, write: &FileWriteTool, op: &str, path: &str) -> ToolResult {
    match op {
        "write" => write.execute(&req(
            "file_write",
            json!({"operation": "write", "path": path, "content": "written"}),
        )),
        "delete" => write.execute(&req(
            "file_write",
            json!({"operation": "delete", "path": path}),
        )),
        _ => read.execute(&req("file_read", json!({"operation": op, "path": path}))),
    }
}

fn traversal_table(mode: ResolveMode) -> TestResult {
    let t = tree()?;
    let open = || Roots::open_with_mode(std::slice::from_ref(&t.root), Some(mode));
    let read = FileReadTool::with_roots(open()?, 1 << 20)?;
    let write = FileWriteTool::with_roots(open()?);
    assert_eq!(open()?.mode(), mode);
    let cases = traversal_cases(&t);
    assert!(cases.len() >= 40);
    let mut wrong = Vec::new();
    for (op, path, want) in &cases {
        let r = run_case(&read, &write, op, path);
        let got = if r.is_success() {
            Want::Allow
        } else {
            Want::Refuse
        };
        if got != *want || output(&r).is_some_and(|o| o.contains("SECRET")) {
            wrong.push(format!("{op} {path}: want {want:?}, got {r:?}"));
        }
    }
    // Nothing outside changed.
    assert_eq!(
        std::fs::read_to_string(t.outside.join("secret.txt"))?,
        "SECRET"
    );
    assert!(!t.outside.join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(t.outside.join("hard_out.txt"))?,
        "shared"
    );
    assert!(wrong.is_empty(), "{mode:?}:\n{}", wrong.join("\n"));
    Ok(())
}

#[test]
fn traversal_table_with_openat2() -> TestResult {
    traversal_table(ResolveMode::Openat2)
}

#[test]
fn traversal_table_with_the_nofollow_walk() -> TestResult {
    traversal_table(ResolveMode::Walk)
}

/// Each refusal has a stable kind, the same in both resolve modes, and no message names the
/// root's absolute path.
fn failure_kinds(mode: ResolveMode) -> TestResult {
    let t = tree()?;
    let open = || Roots::open_with_mode(std::slice::from_ref(&t.root), Some(mode));
    let read = FileReadTool::with_roots(open()?, 4)?;
    let write = FileWriteTool::with_roots(open()?);
    let root = t.root.display().to_string();
    let mut wrong = Vec::new();
    for (op, path, want) in [
        ("read", "loop1", "symlink_loop"),
        ("read", "link_up", "escape"),
        ("read", "../outside/secret.txt", "escape"),
        ("read", "magic", "escape"),
        ("read", "fd_link", "escape"),
        ("read", "not-there.txt", "not_found"),
        ("read", "file.txt", "too_large"),
        ("read", "sub", "wrong_kind"),
        ("read", "file.txt/", "wrong_kind"),
        ("read", "link_slash", "wrong_kind"),
        ("list", "file.txt", "wrong_kind"),
        ("write", "link_in", "not_allowed"),
        ("write", "hard.txt", "not_allowed"),
        ("frobnicate", "file.txt", "invalid_request"),
    ] {
        let r = match op {
            "frobnicate" => read.execute(&req("file_read", json!({"operation": op, "path": path}))),
            _ => run_case(&read, &write, op, path),
        };
        let kind = r.error_kind().map(|k| k.as_str());
        let reason = failure_reason(&r).unwrap_or_default();
        if kind != Some(want) || reason.contains(&root) {
            wrong.push(format!("{op} {path}: want {want}, got {kind:?}: {reason}"));
        }
    }
    // A file asked for as a directory does not exist as one.
    let r = read.execute(&req(
        "file_read",
        json!({"operation": "exists", "path": "file.txt/"}),
    ));
    if r.data() != Some(&json!({"exists": false})) {
        wrong.push(format!("exists file.txt/: {r:?}"));
    }
    assert!(wrong.is_empty(), "{mode:?}:\n{}", wrong.join("\n"));
    Ok(())
}

#[test]
fn failure_kinds_with_openat2() -> TestResult {
    failure_kinds(ResolveMode::Openat2)
}

#[test]
fn failure_kinds_with_the_nofollow_walk() -> TestResult {
    failure_kinds(ResolveMode::Walk)
}

#[test]
fn list_exists_and_read_give_structured_data_and_keep_bytes_that_are_not_utf8() -> TestResult {
    let t = tree()?;
    std::fs::write(t.root.join("bin.dat"), [0xff, 0xfe, b'a'])?;
    let read = FileReadTool::with_roots(Roots::open(std::slice::from_ref(&t.root))?, 1 << 20)?;
    let r = read.execute(&req(
        "file_read",
        json!({"operation": "exists", "path": "file.txt"}),
    ));
    assert_eq!(r.data(), Some(&json!({"exists": true})));
    let r = read.execute(&req(
        "file_read",
        json!({"operation": "list", "path": "sub"}),
    ));
    let entries = r
        .data()
        .and_then(|d| d["entries"].as_array())
        .ok_or("no entries")?;
    assert!(
        entries
            .iter()
            .any(|e| e["name"] == "inner.txt" && e["kind"] == "file"),
        "{entries:?}"
    );
    let r = read.execute(&req(
        "file_read",
        json!({"operation": "read", "path": "bin.dat"}),
    ));
    let data = r.data().ok_or("no data")?;
    assert_eq!(data["utf8"], false);
    assert_eq!(data["content_base64"], "//5h");
    assert_eq!(data["bytes"], 3);
    // From Rust, one line builds a request.
    let one = ToolRequest::json(
        "s1",
        "file_read",
        json!({"operation": "exists", "path": "x"}),
    )?;
    assert_eq!(one.session_id.as_str(), "s1");
    assert!(ToolRequest::json("s1", "file_read", json!(["not", "an", "object"])).is_err());
    Ok(())
}

#[test]
fn shell_results_carry_both_streams_exit_code_signal_and_truncation() -> TestResult {
    let sh = ShellTool::new(ShellOptions {
        allowed_executables: vec!["sh".into()],
        timeout: Duration::from_secs(20),
        output_cap: 64,
        isolation: correx::IsolationOptions {
            mode: correx::IsolationMode::BestEffort,
            ..correx::IsolationOptions::default()
        },
        ..ShellOptions::default()
    })?;
    let run = |script: &str, extra: Value| {
        let mut params = json!({"argv": ["sh", "-c", script]});
        if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        sh.execute(&req("shell", params))
    };
    let ok = run("echo out; echo err >&2", json!({}));
    let d = ok.data().ok_or("no data on a success")?;
    assert_eq!(
        (d["exit_code"].clone(), d["signal"].clone()),
        (json!(0), Value::Null)
    );
    assert_eq!(
        (d["stdout"].as_str(), d["stderr"].as_str()),
        (Some("out\n"), Some("err\n"))
    );
    let failed = run("echo partial; echo why >&2; exit 3", json!({}));
    assert_eq!(
        failed.error_kind().map(|k| k.as_str()),
        Some("non_zero_exit")
    );
    let d = failed.data().ok_or("no data on an exit")?;
    assert_eq!(d["exit_code"], 3);
    assert_eq!(
        (d["stdout"].as_str(), d["stderr"].as_str()),
        (Some("partial\n"), Some("why\n"))
    );
    let killed = run("kill -9 $$", json!({}));
    assert_eq!(killed.error_kind().map(|k| k.as_str()), Some("signalled"));
    assert_eq!(killed.data().map(|d| d["signal"].clone()), Some(json!(9)));
    let big = run("head -c 1000 /dev/zero | tr '\\0' x", json!({}));
    let d = big.data().ok_or("no data")?;
    assert_eq!(
        (
            d["stdout_truncated"].clone(),
            d["stdout_dropped_bytes"].clone()
        ),
        (json!(true), json!(936))
    );
    let binary = run("printf '\\377\\376'", json!({}));
    assert_eq!(
        binary.data().map(|d| d["stdout_base64"].clone()),
        Some(json!("//4="))
    );
    // A request's own timeout, bounded by the configured one.
    let slow = run("echo started; sleep 5", json!({"timeout_ms": 300}));
    assert_eq!(slow.error_kind().map(|k| k.as_str()), Some("timed_out"));
    let d = slow.data().ok_or("no data on a timeout")?;
    assert_eq!(
        (d["timed_out"].clone(), d["stdout"].as_str()),
        (json!(true), Some("started\n"))
    );
    assert!(d["duration_ms"].as_u64().is_some_and(|ms| ms < 4000), "{d}");
    let bad = run("true", json!({"timeout_ms": "soon"}));
    assert_eq!(
        bad.error_kind().map(|k| k.as_str()),
        Some("invalid_request")
    );
    // A cancel: the data is there too.
    let token = correx::CancelToken::new();
    let t2 = token.clone();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        t2.cancel();
    });
    let cancelled = sh.execute_cancellable(
        &req(
            "shell",
            json!({"argv": ["sh", "-c", "echo before; sleep 10"]}),
        ),
        &token,
    );
    let _ = canceller.join();
    assert_eq!(
        cancelled.error_kind().map(|k| k.as_str()),
        Some("cancelled")
    );
    let d = cancelled.data().ok_or("no data on a cancel")?;
    assert_eq!(
        (d["cancelled"].clone(), d["stdout"].as_str()),
        (json!(true), Some("before\n"))
    );
    Ok(())
}

#[test]
fn exists_does_not_reveal_whether_an_outside_path_exists() -> TestResult {
    let t = tree()?;
    let read = FileReadTool::new(std::slice::from_ref(&t.root))?;
    let ask = |p: &str| read.execute(&req("file_read", json!({"operation": "exists", "path": p})));
    let there = ask(&format!("{}/secret.txt", t.outside.display()));
    let not_there = ask(&format!("{}/nope.txt", t.outside.display()));
    let strip = |r: &ToolResult| {
        failure_reason(r).map(|s| s.replace("secret.txt", "X").replace("nope.txt", "X"))
    };
    assert!(strip(&there).is_some());
    assert_eq!(strip(&there), strip(&not_there));
    assert_eq!(output(&ask("file.txt")), Some("true"));
    assert_eq!(output(&ask("missing.txt")), Some("false"));
    Ok(())
}

#[test]
fn empty_allowed_paths_deny_every_path() -> TestResult {
    let read = FileReadTool::new(&[])?;
    let write = FileWriteTool::new(&[])?;
    let edit = FileEditTool::new(&[])?;
    for p in ["/etc/passwd", "file.txt", "/tmp"] {
        let r = read.execute(&req("file_read", json!({"operation": "read", "path": p})));
        assert!(failure_reason(&r).is_some_and(|m| m.contains("no allowed paths")));
        let r = write.execute(&req(
            "file_write",
            json!({"operation": "write", "path": p, "content": "x"}),
        ));
        assert!(!r.is_success());
        let r = edit.execute(&req(
            "file_edit",
            json!({"operation": "append", "path": p, "content": "x"}),
        ));
        assert!(!r.is_success());
    }
    Ok(())
}

#[test]
fn read_is_capped_and_lists_report_kinds() -> TestResult {
    let t = tree()?;
    let read = FileReadTool::with_roots(Roots::open(std::slice::from_ref(&t.root))?, 4)?;
    let r = read.execute(&req(
        "file_read",
        json!({"operation": "read", "path": "file.txt"}),
    ));
    assert!(failure_reason(&r).is_some_and(|m| m.contains("6 bytes, over the read cap of 4")));
    let r = read.execute(&req(
        "file_read",
        json!({"operation": "list", "path": "sub"}),
    ));
    assert_eq!(
        output(&r),
        Some("inner.txt\tfile\nup2\tsymlink\nup_link\tsymlink")
    );
    Ok(())
}

#[test]
fn a_file_whose_size_the_kernel_reports_as_zero_is_read_whole_and_still_capped() -> TestResult {
    // procfs reports st_size 0 for files that have content: the read must not trust the size.
    let proc_self = std::fs::canonicalize("/proc/self")?;
    let read = FileReadTool::new(std::slice::from_ref(&proc_self))?;
    let r = read.execute(&req(
        "file_read",
        json!({"operation": "read", "path": "status"}),
    ));
    assert!(
        output(&r).is_some_and(|o| o.starts_with("Name:") && o.contains("\nPid:")),
        "{r:?}"
    );
    let capped = FileReadTool::with_roots(Roots::open(std::slice::from_ref(&proc_self))?, 8)?;
    let r = capped.execute(&req(
        "file_read",
        json!({"operation": "read", "path": "status"}),
    ));
    assert!(
        failure_reason(&r).is_some_and(|m| m.contains("over the read cap of 8")),
        "{r:?}"
    );
    Ok(())
}

#[test]
fn read_only_tools_affect_no_paths_and_writers_name_their_target() -> TestResult {
    let t = tree()?;
    let read = FileReadTool::new(std::slice::from_ref(&t.root))?;
    assert!(read.as_file_affecting().is_none());
    let write = FileWriteTool::new(std::slice::from_ref(&t.root))?;
    let paths = write.affected_paths(&req(
        "file_write",
        json!({"operation": "write", "path": "sub/new.txt", "content": ""}),
    ))?;
    assert_eq!(
        paths,
        vec![std::fs::canonicalize(&t.root)?.join("sub/new.txt")]
    );
    assert!(write
        .affected_paths(&req(
            "file_write",
            json!({"operation": "write", "path": "/etc/passwd"})
        ))
        .is_err());
    Ok(())
}

#[test]
fn writes_are_atomic_keep_the_mode_and_leave_no_temp_files() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let t = tree()?;
    let path = t.root.join("file.txt");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let write = FileWriteTool::new(std::slice::from_ref(&t.root))?;
    let r = write.execute(&req(
        "file_write",
        json!({"operation": "write", "path": "file.txt", "content": "new content"}),
    ));
    assert!(r.is_success(), "{r:?}");
    assert_eq!(std::fs::read_to_string(&path)?, "new content");
    assert_eq!(
        std::fs::metadata(&path)?.permissions().mode() & 0o777,
        0o600
    );
    let leftovers: Vec<_> = std::fs::read_dir(&t.root)?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("correx-tmp"))
        .collect();
    assert!(leftovers.is_empty());
    Ok(())
}

#[test]
fn rewrites_drop_setuid_bits() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let t = tree()?;
    let path = t.root.join("file.txt");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o4755))?;
    let write = FileWriteTool::new(std::slice::from_ref(&t.root))?;
    let r = write.execute(&req(
        "file_write",
        json!({"operation": "write", "path": "file.txt", "content": "x"}),
    ));
    assert!(r.is_success());
    assert_eq!(
        std::fs::metadata(&path)?.permissions().mode() & 0o7777,
        0o755
    );
    Ok(())
}

#[test]
fn affected_paths_are_real_paths_inside_the_root() -> TestResult {
    let t = tree()?;
    let write = FileWriteTool::new(std::slice::from_ref(&t.root))?;
    let root = std::fs::canonicalize(&t.root)?;
    let ask = |p: &str| {
        write.affected_paths(&req(
            "file_write",
            json!({"operation": "write", "path": p, "content": ""}),
        ))
    };
    assert_eq!(ask("link_sub/new.txt")?, vec![root.join("sub/new.txt")]);
    assert_eq!(ask("sub/../x.txt")?, vec![root.join("x.txt")]);
    // A symlink as the last component is named as itself, never followed.
    assert_eq!(ask("link_up")?, vec![root.join("link_up")]);
    for bad in [
        "sub/../../outside/x",
        "link_dir_out/x",
        "../root/x",
        "/etc/passwd",
    ] {
        assert!(ask(bad).is_err(), "{bad} was accepted");
    }
    Ok(())
}

#[test]
fn delete_removes_a_symlink_never_its_target() -> TestResult {
    let t = tree()?;
    let write = FileWriteTool::new(std::slice::from_ref(&t.root))?;
    let r = write.execute(&req(
        "file_write",
        json!({"operation": "delete", "path": "link_in"}),
    ));
    assert!(r.is_success());
    assert!(std::fs::symlink_metadata(t.root.join("link_in")).is_err());
    assert_eq!(std::fs::read_to_string(t.root.join("file.txt"))?, "inside");
    Ok(())
}

#[test]
fn symlink_swap_race_never_reads_outside() -> TestResult {
    for mode in [ResolveMode::Openat2, ResolveMode::Walk] {
        let t = tree()?;
        std::fs::create_dir(t.root.join("racer"))?;
        std::fs::write(t.root.join("racer/f.txt"), "inside")?;
        std::fs::write(t.outside.join("f.txt"), "SECRET")?;
        symlink("../outside", t.root.join("racer_alt"))?;
        let read = FileReadTool::with_roots(
            Roots::open_with_mode(std::slice::from_ref(&t.root), Some(mode))?,
            1024,
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let flipper = {
            let (stop, root) = (Arc::clone(&stop), t.root.clone());
            std::thread::spawn(move || -> std::io::Result<u64> {
                let a = std::ffi::CString::new(root.join("racer").as_os_str().as_encoded_bytes())?;
                let b =
                    std::ffi::CString::new(root.join("racer_alt").as_os_str().as_encoded_bytes())?;
                let mut flips = 0;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: two valid C strings; RENAME_EXCHANGE swaps the entries atomically.
                    let r = unsafe {
                        libc::renameat2(
                            libc::AT_FDCWD,
                            a.as_ptr(),
                            libc::AT_FDCWD,
                            b.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    };
                    if r != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    flips += 1;
                }
                Ok(flips)
            })
        };
        let mut leaked = 0;
        let mut inside = 0;
        for _ in 0..10_000 {
            let r = read.execute(&req(
                "file_read",
                json!({"operation": "read", "path": "racer/f.txt"}),
            ));
            match output(&r) {
                Some("SECRET") => leaked += 1,
                Some(_) => inside += 1,
                None => {}
            }
        }
        stop.store(true, Ordering::Relaxed);
        let flips = flipper.join().map_err(|_| "flipper panicked")??;
        assert_eq!(leaked, 0, "{mode:?}: read the outside file {leaked} times");
        assert!(
            flips > 100 && inside > 0,
            "{mode:?}: the race did not run ({flips} flips, {inside} reads)"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------- edit

fn edit_tool(t: &Tree) -> Result<FileEditTool, ToolError> {
    FileEditTool::new(std::slice::from_ref(&t.root))
}

#[test]
fn edit_append_and_replace_exactly_once() -> TestResult {
    let t = tree()?;
    let edit = edit_tool(&t)?;
    let r = edit.execute(&req(
        "file_edit",
        json!({"operation": "append", "path": "file.txt", "content": " more"}),
    ));
    assert!(r.is_success(), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(t.root.join("file.txt"))?,
        "inside more"
    );
    let r = edit.execute(&req("file_edit", json!({"operation": "replace", "path": "file.txt", "target": "more", "replacement": "less"})));
    assert!(r.is_success(), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(t.root.join("file.txt"))?,
        "inside less"
    );
    std::fs::write(t.root.join("twice.txt"), "ab ab")?;
    for (target, count) in [("ab", 2), ("zz", 0)] {
        let r = edit.execute(&req("file_edit", json!({"operation": "replace", "path": "twice.txt", "target": target, "replacement": "x"})));
        let reason = failure_reason(&r).ok_or("expected failure")?;
        assert!(
            reason.contains(&format!("occurs {count} times")),
            "{reason}"
        );
        assert!(matches!(
            r,
            ToolResult::Failure {
                recoverable: false,
                ..
            }
        ));
    }
    assert_eq!(std::fs::read_to_string(t.root.join("twice.txt"))?, "ab ab");
    let r = edit.execute(&req(
        "file_edit",
        json!({"operation": "append", "path": "missing.txt", "content": "x"}),
    ));
    assert!(failure_reason(&r).is_some_and(|m| m.contains("does not exist")));
    Ok(())
}

#[test]
fn edit_patch_applies_a_unified_diff_with_the_real_patch_binary() -> TestResult {
    let t = tree()?;
    let edit = edit_tool(&t)?;
    std::fs::write(t.root.join("code.txt"), "one\ntwo\nthree\n")?;
    let diff = "--- code.txt\n+++ code.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n\
                --- /dev/null\n+++ sub/created.txt\n@@ -0,0 +1 @@\n+fresh\n";
    let paths = edit.affected_paths(&req(
        "file_edit",
        json!({"operation": "patch", "patch": diff}),
    ))?;
    let root = std::fs::canonicalize(&t.root)?;
    assert_eq!(
        paths,
        vec![root.join("code.txt"), root.join("sub/created.txt")]
    );
    let r = edit.execute(&req(
        "file_edit",
        json!({"operation": "patch", "patch": diff}),
    ));
    assert!(r.is_success(), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(t.root.join("code.txt"))?,
        "one\nTWO\nthree\n"
    );
    assert_eq!(
        std::fs::read_to_string(t.root.join("sub/created.txt"))?,
        "fresh\n"
    );
    // Applying it again fails (forward only) and changes nothing.
    let r = edit.execute(&req(
        "file_edit",
        json!({"operation": "patch", "patch": diff}),
    ));
    assert!(!r.is_success());
    assert_eq!(
        std::fs::read_to_string(t.root.join("code.txt"))?,
        "one\nTWO\nthree\n"
    );
    Ok(())
}

#[test]
fn edit_patch_refuses_other_diff_formats_and_outside_files() -> TestResult {
    let t = tree()?;
    let edit = edit_tool(&t)?;
    std::fs::write(t.root.join("code.txt"), "one\n")?;
    let bad = [
        "1c1\n< one\n---\n> ONE\n",
        "1c\nONE\n.\n",
        "*** code.txt\n--- code.txt\n***************\n*** 1 ****\n! one\n--- 1 ----\n! ONE\n",
        "--- ../outside/secret.txt\n+++ ../outside/secret.txt\n@@ -1 +1 @@\n-SECRET\n+x\n",
        "--- link_up\n+++ link_up\n@@ -1 +1 @@\n-SECRET\n+x\n",
        "--- code.txt\n+++ other.txt\n@@ -1 +1 @@\n-one\n+ONE\n",
        "diff --git code.txt code.txt\nnew file mode 120000\n--- /dev/null\n+++ evil\n@@ -0,0 +1 @@\n+/etc/shadow\n",
    ];
    for diff in bad {
        let r = edit.execute(&req(
            "file_edit",
            json!({"operation": "patch", "patch": diff}),
        ));
        assert!(!r.is_success(), "accepted: {diff}");
    }
    assert_eq!(std::fs::read_to_string(t.root.join("code.txt"))?, "one\n");
    assert_eq!(
        std::fs::read_to_string(t.outside.join("secret.txt"))?,
        "SECRET"
    );
    Ok(())
}

// ---------------------------------------------------------------- registry

#[test]
fn registry_refuses_two_tools_with_one_name() -> TestResult {
    let t = tree()?;
    let a: Arc<dyn Tool> = Arc::new(FileReadTool::new(std::slice::from_ref(&t.root))?);
    let b: Arc<dyn Tool> = Arc::new(FileReadTool::new(std::slice::from_ref(&t.root))?);
    let err = ToolRegistry::build(vec![a.clone(), b]).unwrap_err();
    assert!(matches!(err, ToolError::DuplicateTool { ref name } if name == "file_read"));
    let reg = ToolRegistry::build(vec![a])?;
    assert!(reg.resolve("file_read").is_some() && reg.resolve("shell").is_none());
    Ok(())
}

#[test]
fn nothing_panics_on_garbage_parameters() -> TestResult {
    let t = tree()?;
    let tools: Vec<Box<dyn Tool>> = vec![
        Box::new(FileReadTool::new(std::slice::from_ref(&t.root))?),
        Box::new(FileWriteTool::new(std::slice::from_ref(&t.root))?),
        Box::new(FileEditTool::new(std::slice::from_ref(&t.root))?),
        Box::new(shell(&["ls"])?),
    ];
    let garbage = [
        json!({}),
        json!({"operation": 5}),
        json!({"operation": "read", "path": null}),
        json!({"operation": "read", "path": "a\u{0}b"}),
        json!({"operation": "write", "path": "x"}),
        json!({"operation": "patch", "patch": ""}),
        json!({"operation": "replace", "path": "file.txt", "target": "", "replacement": "x"}),
        json!({"argv": [null]}),
        json!({"argv": ["ls\u{0}"]}),
        json!({"operation": "list", "path": "file.txt"}),
    ];
    for tool in &tools {
        for g in &garbage {
            let r = tool.execute(&req(tool.name(), g.clone()));
            assert!(
                !r.is_success() || tool.name() == "shell",
                "{} accepted {g}",
                tool.name()
            );
        }
    }
    Ok(())
}

#[test]
fn the_registry_describes_enabled_tools_and_the_disabled_built_ins() -> TestResult {
    let dir = TempDir::new("describe");
    let read: Arc<dyn Tool> = Arc::new(FileReadTool::new(&[dir.path().to_path_buf()])?);
    let registry = ToolRegistry::build(vec![read])?;
    let list = registry.describe();
    let names: Vec<(&str, bool)> = list.iter().map(|d| (d.name.as_str(), d.enabled)).collect();
    assert_eq!(
        names,
        [
            ("file_edit", false),
            ("file_read", true),
            ("file_write", false),
            ("jobs", false),
            ("shell", false)
        ]
    );
    let fr = &list[1];
    assert_eq!(fr.operations, ["read", "list", "exists"]);
    assert_eq!(fr.parameters["required"], json!(["operation", "path"]));
    assert!(!fr.description.is_empty());
    assert_eq!(
        list[3].operations,
        ["list", "read", "wait", "signal", "stop"]
    );
    assert_eq!(list[4].parameters["required"], json!(["argv"]));
    assert!(list[4].operations.is_empty());
    // A schema is what the tool accepts: its own required fields validate.
    let req = ToolRequest::new(
        SessionId::from("s"),
        "file_read",
        json!({"operation": "exists", "path": "x"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    );
    assert!(
        fr.enabled
            && registry
                .resolve("file_read")
                .is_some_and(|t| t.validate_request(&req).is_valid())
    );
    Ok(())
}
