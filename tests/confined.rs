//! The kernel-confined shell: escapes leave nothing behind, the filesystem and the network are
//! denied outside the policy, limits end hogs, and the policy applied is the one recorded.
//!
//! These machines run tests as root; users do not. Each scenario therefore runs twice: in this
//! process, and in a child test process that first drops to uid/gid 65534 (nobody), so the
//! unprivileged path (Landlock without privileges, a user namespace or the subreaper) is
//! proven too.

use crate::tools_util::{count_processes, marker};
use crate::util::{child_test, is_child, TempDir};
use correx::{
    IsolationMode, IsolationOptions, ResourceLimits, SessionId, ShellOptions, ShellTool, Tool,
    ToolRequest, ToolResult,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const NOBODY: u32 = 65534;

fn req(params: Value) -> ToolRequest {
    ToolRequest::new(
        SessionId::from("confined"),
        "shell",
        params.as_object().cloned().unwrap_or_default(),
    )
}

fn run(tool: &ShellTool, argv: &[&str]) -> ToolResult {
    tool.execute(&req(json!({ "argv": argv })))
}

fn stdout(r: &ToolResult) -> Option<&str> {
    match r {
        ToolResult::Success { output, .. } => Some(output),
        ToolResult::Failure { .. } => None,
    }
}

fn reason(r: &ToolResult) -> String {
    match r {
        ToolResult::Success { output, .. } => format!("(success) {output}"),
        ToolResult::Failure { reason, .. } => reason.clone(),
    }
}

/// Whether a run failed as a path outside its grants makes it fail: not in its view (ENOENT,
/// or EROFS creating beside a grant), or refused by Landlock where there is no view (EACCES).
fn denied(r: &ToolResult) -> bool {
    let why = reason(r);
    !r.is_success()
        && [
            "Permission denied",
            "No such file or directory",
            "Read-only file system",
        ]
        .iter()
        .any(|m| why.contains(m))
}

/// Live processes whose command line holds `m`, after giving the kernel a moment to deliver
/// what it has already decided.
fn survivors(m: &str) -> usize {
    std::thread::sleep(Duration::from_millis(50));
    count_processes(|c| c.contains(m))
}

fn tool(allowed: &[&str], work: &[&Path], f: impl FnOnce(&mut ShellOptions)) -> ShellTool {
    let mut o = ShellOptions {
        allowed_executables: allowed.iter().map(|s| (*s).to_owned()).collect(),
        working_roots: work.iter().map(|p| p.to_path_buf()).collect(),
        timeout: Duration::from_secs(10),
        ..ShellOptions::default()
    };
    f(&mut o);
    let t = ShellTool::new(o).expect("the shell tool builds");
    assert_eq!(t.refusal(), None, "this kernel cannot confine the shell");
    t
}

/// Runs `scenario` here and, when we are root, again as nobody in a child test process.
fn both(name: &str, scenario: Scenario) -> TestResult {
    scenario()?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    crate::util::assert_child_passes(
        child_test("confined::unprivileged_child").env("CORREX_CHILD_SCENARIO", name),
        "scenario passed",
        &format!("{name} as uid {NOBODY}"),
    )?;
    Ok(())
}

type Scenario = fn() -> TestResult;

const SCENARIOS: &[(&str, Scenario)] = &[
    ("escapes", escapes),
    ("filesystem", filesystem),
    ("network", network),
    ("limits", limits),
    ("fork_bomb", fork_bomb),
    ("cwd_and_tmp", cwd_and_tmp),
    ("host_environment", host_environment),
    ("root_powers", root_powers),
    ("syscall_floor", syscall_floor),
    ("unix_datagrams", unix_datagrams),
];

/// The child side of [`both`]: drop to nobody, then run the named scenario.
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

// ------------------------------------------------------------------ nothing outlives a run

fn escapes() -> TestResult {
    // Both containments: the PID namespace where the kernel allows one, and the subreaper
    // every kernel has.
    for subreaper in [false, true] {
        escapes_with(subreaper)?;
    }
    Ok(())
}

fn escapes_with(subreaper: bool) -> TestResult {
    let work = TempDir::new("escapes");
    let t = tool(&["sh", "setsid", "python3"], &[work.path()], |o| {
        o.timeout = Duration::from_millis(1500);
        o.isolation.force_subreaper = subreaper;
    });
    if subreaper {
        assert_eq!(t.applied_policy().to_json()["containment"], "subreaper");
    }
    // A detached daemon, and a successful return.
    let m = marker();
    let r = run(
        &t,
        &["sh", "-c", &format!("setsid -f sleep 1{m}; echo started")],
    );
    assert_eq!(stdout(&r), Some("started\n"), "{}", reason(&r));
    assert_eq!(
        survivors(&m),
        0,
        "setsid -f sleep outlived a successful run"
    );

    // A busy loop in its own session, and a timeout.
    let m = marker();
    let script = format!("setsid sh -c 'm={m}; while :; do :; done' & sleep 100");
    let r = run(&t, &["sh", "-c", &script]);
    assert!(reason(&r).contains("timed out"), "{}", reason(&r));
    assert_eq!(survivors(&m), 0, "a detached busy loop outlived a timeout");

    // setpgid, then exec: no new session, just another group.
    let m = marker();
    let py = format!(
        "import os\nif os.fork() == 0:\n    os.setpgid(0, 0)\n    os.execvp('sleep', ['sleep', '1{m}'])\nprint('forked')"
    );
    let r = run(&t, &["python3", "-c", &py]);
    assert_eq!(stdout(&r), Some("forked\n"), "{}", reason(&r));
    assert_eq!(survivors(&m), 0, "a setpgid child outlived its run");

    // A double-forked daemon: its parent exits at once, so it is orphaned before the run ends.
    let m = marker();
    let r = run(
        &t,
        &["sh", "-c", &format!("(sh -c 'sleep 1{m}' &) ; exit 0")],
    );
    assert!(r.is_success(), "{}", reason(&r));
    assert_eq!(survivors(&m), 0, "a double-forked daemon outlived its run");
    Ok(())
}

#[test]
fn escapes_leave_no_process_behind() -> TestResult {
    both("escapes", escapes)
}

// ------------------------------------------------------------------ filesystem

fn filesystem() -> TestResult {
    let base = TempDir::new("confined-fs");
    let work = base.join("work");
    let home = base.join("home");
    std::fs::create_dir_all(&work)?;
    std::fs::create_dir_all(home.join(".ssh"))?;
    let secret = home.join(".ssh/id_ed25519");
    std::fs::write(&secret, "PRIVATE KEY")?;
    let outside = base.join("outside.txt");
    std::fs::write(&outside, "original")?;
    let t = tool(&["sh", "cat", "ls", "cp", "true"], &[&work], |_| {});
    let s = |p: &Path| p.display().to_string();

    // Writing inside a working dir works.
    let r = run(
        &t,
        &["sh", "-c", &format!("echo made > {}/new.txt", s(&work))],
    );
    assert!(r.is_success(), "{}", reason(&r));
    assert_eq!(std::fs::read_to_string(work.join("new.txt"))?, "made\n");

    // Writing, truncating or replacing outside fails (the path is not in the run's view, or
    // Landlock refuses it where there is no view), and the target is unchanged.
    for script in [
        format!("echo changed > {}", s(&outside)),
        format!(": > {}", s(&outside)),
        format!("echo x > {}/planted", s(base.path())),
        format!("cp {}/new.txt {}", s(&work), s(&outside)),
    ] {
        let r = run(&t, &["sh", "-c", &script]);
        assert!(!r.is_success(), "{script} succeeded");
        assert!(denied(&r), "{script}: {}", reason(&r));
    }
    assert_eq!(std::fs::read_to_string(&outside)?, "original");
    assert!(!base.join("planted").exists());

    // A binary written into a working dir cannot be run: write is not execute.
    let r = run(
        &t,
        &[
            "sh",
            "-c",
            "cp /usr/bin/true ./copied && ./copied && echo ran",
        ],
    );
    assert!(reason(&r).contains("Permission denied"), "{}", reason(&r));

    // A file planted outside every root cannot be read, listed or copied in.
    let r = run(&t, &["cat", &s(&secret)]);
    assert!(denied(&r), "{}", reason(&r));
    let r = run(&t, &["ls", &s(&home.join(".ssh"))]);
    assert!(denied(&r), "{}", reason(&r));
    let r = run(&t, &["cp", &s(&secret), &s(&work.join("stolen"))]);
    assert!(
        !r.is_success() && !work.join("stolen").exists(),
        "{}",
        reason(&r)
    );
    Ok(())
}

#[test]
fn filesystem_outside_the_policy_is_denied_by_the_kernel() -> TestResult {
    both("filesystem", filesystem)
}

// ------------------------------------------------------------------ network

fn network() -> TestResult {
    use std::net::{TcpListener, UdpSocket};
    let work = TempDir::new("confined-net");
    let listener = TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let port = listener.local_addr()?.port();
    let udp = UdpSocket::bind("127.0.0.1:0")?;
    udp.set_nonblocking(true)?;
    let udp_port = udp.local_addr()?.port();
    let connect = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected");
    let send = format!("echo hi > /dev/udp/127.0.0.1/{udp_port} && echo sent");

    let denied = tool(&["bash", "python3"], &[work.path()], |_| {});
    // A UNIX socket outside the run (a user's D-Bus, a Docker socket) is not reachable either.
    let sock_path = work.join("daemon.sock");
    let unix = std::os::unix::net::UnixListener::bind(&sock_path)?;
    unix.set_nonblocking(true)?;
    let py = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({:?})\nprint('connected')",
        sock_path.display().to_string()
    );
    let r = run(&denied, &["python3", "-c", &py]);
    assert!(
        !r.is_success(),
        "a UNIX connect got through: {}",
        reason(&r)
    );
    assert!(unix.accept().is_err(), "the UNIX listener saw a connection");
    // socketpair still works: a program's own plumbing is not network.
    let r = run(
        &denied,
        &[
            "python3",
            "-c",
            "import socket\na, b = socket.socketpair()\na.send(b'x')\nprint(b.recv(1))",
        ],
    );
    assert_eq!(stdout(&r), Some("b'x'\n"), "{}", reason(&r));
    let r = run(&denied, &["bash", "-c", &connect]);
    assert!(!r.is_success(), "a TCP connect got through: {}", reason(&r));
    let r = run(&denied, &["bash", "-c", &send]);
    assert!(!r.is_success(), "a UDP send got through: {}", reason(&r));
    std::thread::sleep(Duration::from_millis(50));
    assert!(listener.accept().is_err(), "the listener saw a connection");
    let mut buf = [0u8; 16];
    assert!(udp.recv(&mut buf).is_err(), "the UDP socket got a datagram");

    let allowed = tool(&["bash"], &[work.path()], |o| {
        o.isolation.network = correx::NetworkPolicy::Open
    });
    let r = run(&allowed, &["bash", "-c", &connect]);
    assert_eq!(stdout(&r), Some("connected\n"), "{}", reason(&r));
    std::thread::sleep(Duration::from_millis(50));
    assert!(listener.accept().is_ok(), "network: true did not connect");
    Ok(())
}

#[test]
fn network_is_denied_unless_opted_in() -> TestResult {
    both("network", network)
}

// ------------------------------------------------------------------ limits

fn limits() -> TestResult {
    let work = TempDir::new("confined-limits");
    let t = tool(&["python3", "sh"], &[work.path()], |o| {
        o.isolation.limits = ResourceLimits {
            address_space_bytes: Some(256 << 20),
            file_size_bytes: Some(1 << 20),
            ..ResourceLimits::default()
        };
    });
    let r = run(
        &t,
        &[
            "python3",
            "-c",
            "x = bytearray(1 << 30); print('allocated')",
        ],
    );
    assert!(reason(&r).contains("MemoryError"), "{}", reason(&r));
    // A file past the size limit stops at the limit (SIGXFSZ).
    let big = work.join("big");
    let r = run(
        &t,
        &[
            "sh",
            "-c",
            &format!("head -c 4194304 /dev/zero > {}", big.display()),
        ],
    );
    assert!(!r.is_success(), "{}", reason(&r));
    assert!(std::fs::metadata(&big)?.len() <= 1 << 20);
    Ok(())
}

#[test]
fn memory_and_file_size_hogs_end_at_their_limits() -> TestResult {
    both("limits", limits)
}

fn fork_bomb() -> TestResult {
    let work = TempDir::new("confined-bomb");
    let t = tool(&["bash"], &[work.path()], |o| {
        o.timeout = Duration::from_secs(3);
        o.isolation.limits.max_processes = Some(64);
    });
    let enforced = t.applied_policy().to_json()["limits"]["max_processes_enforced"] == json!(true);
    if !enforced {
        eprintln!(
            "!!! fork bomb not run: max_processes is not enforced here ({}) !!!",
            t.applied_policy().to_json()["containment"]
        );
        return Ok(());
    }
    eprintln!(
        "process bound: {}",
        t.applied_policy().to_json()["limits"]["process_bound"]
    );
    let m = marker();
    let bomb = format!("m={m}; b() {{ b | b & }}; b; sleep 100");
    let r = run(&t, &["bash", "-c", &bomb]);
    assert!(!r.is_success());
    assert_eq!(survivors(&m), 0, "fork bomb processes survived");
    // The host still spawns at once.
    let started = std::time::Instant::now();
    std::process::Command::new("/bin/true").status()?;
    assert!(started.elapsed() < Duration::from_secs(2));
    Ok(())
}

#[test]
fn a_fork_bomb_ends_with_its_run() -> TestResult {
    both("fork_bomb", fork_bomb)
}

// ------------------------------------------------------------------ cwd, tmp, timeouts

fn cwd_and_tmp() -> TestResult {
    let work = TempDir::new("confined-cwd");
    let real = std::fs::canonicalize(work.path())?;
    let t = tool(&["sh"], &[work.path()], |_| {});
    let r = run(
        &t,
        &[
            "sh",
            "-c",
            "pwd; echo $TMPDIR; echo x > $TMPDIR/f && echo tmp-ok",
        ],
    );
    let out = stdout(&r).ok_or_else(|| reason(&r))?.to_owned();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        real.display().to_string(),
        "default cwd is the first working dir"
    );
    let tmp = PathBuf::from(lines[1]);
    assert_eq!(lines[2], "tmp-ok");
    assert!(!tmp.exists(), "the run's temp directory was not removed");

    // A temp directory the run left locked up (a subdirectory without write permission) is
    // still removed.
    let r = run(
        &t,
        &["sh", "-c", "mkdir -p $TMPDIR/a/b && touch $TMPDIR/a/b/f && chmod 500 $TMPDIR/a $TMPDIR/a/b; echo $TMPDIR"],
    );
    let left = PathBuf::from(stdout(&r).ok_or_else(|| reason(&r))?.trim());
    assert!(!left.exists(), "{} was left behind", left.display());

    // Without working dirs the run starts in its private temp directory.
    let bare = tool(&["sh"], &[], |_| {});
    let r = run(&bare, &["sh", "-c", "pwd; echo $TMPDIR"]);
    let out = stdout(&r).ok_or_else(|| reason(&r))?.to_owned();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], lines[1], "{out}");

    // A timeout keeps what was captured so far.
    let quick = tool(&["sh"], &[work.path()], |o| {
        o.timeout = Duration::from_millis(500)
    });
    let r = run(
        &quick,
        &[
            "sh",
            "-c",
            "echo partial-out; echo partial-err >&2; sleep 10",
        ],
    );
    let why = reason(&r);
    assert!(why.contains("timed out"), "{why}");
    assert!(
        why.contains("partial-out") && why.contains("partial-err"),
        "{why}"
    );
    Ok(())
}

#[test]
fn runs_start_in_a_working_dir_with_a_private_tmp_and_timeouts_keep_output() -> TestResult {
    both("cwd_and_tmp", cwd_and_tmp)
}

fn host_environment() -> TestResult {
    std::env::set_var("CORREX_HOST_SECRET", "hunter2");
    let work = TempDir::new("confined-env");
    let t = tool(&["cat", "sh"], &[work.path()], |_| {});
    let host = std::process::id().to_string();
    let r = run(&t, &["cat", &format!("/proc/{host}/environ")]);
    assert!(!r.is_success(), "read the host's environment");
    assert!(!reason(&r).contains("hunter2"));
    let r = run(
        &t,
        &["sh", "-c", "cat /proc/1/environ; cat /proc/$PPID/environ"],
    );
    assert!(!reason(&r).contains("hunter2"));
    Ok(())
}

#[test]
fn the_host_environment_is_not_readable_through_proc() -> TestResult {
    both("host_environment", host_environment)
}

// ------------------------------------------------------------------ nothing of root's

/// What python3 reports of its own privileges: every capability set, no_new_privs, uid, gid.
const PRIVILEGES_PY: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)
data = (ctypes.c_uint32 * 6)()
assert libc.capget(hdr, data) == 0
eff = data[0] | data[3] << 32
prm = data[1] | data[4] << 32
inh = data[2] | data[5] << 32
bnd = sum(1 << c for c in range(64) if libc.prctl(23, c, 0, 0, 0) == 1)
amb = sum(1 << c for c in range(64) if libc.prctl(47, 1, c, 0, 0) == 1)
print(f"eff={eff:x} prm={prm:x} inh={inh:x} bnd={bnd:x} amb={amb:x} nnp={libc.prctl(39, 0, 0, 0, 0)} uid={os.getuid()} gid={os.getgid()}")
"#;

fn root_powers() -> TestResult {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let base = TempDir::new("confined-root");
    let work = base.join("work");
    let readable = base.join("readable");
    std::fs::create_dir_all(&work)?;
    std::fs::create_dir_all(&readable)?;
    // A file of the host user's, 0600, under a read path: unreadable when the host is root
    // (the run is not root), the run's own otherwise.
    let private = readable.join("private");
    std::fs::write(&private, "host-only")?;
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600))?;
    std::fs::write(work.join("existing.txt"), "old\n")?;
    let t = tool(&["sh", "python3", "mknod", "cat"], &[&work], |o| {
        o.isolation.read_paths = vec![readable.clone()];
    });
    // SAFETY: geteuid and getegid have no preconditions.
    let (host_uid, host_gid) = unsafe { (libc::geteuid(), libc::getegid()) };

    // SAFETY: prctl(PR_GET_DUMPABLE) reads a flag.
    let dumpable = || unsafe { libc::prctl(libc::PR_GET_DUMPABLE) };
    let host_dumpable = dumpable();
    // No capability in any set, no_new_privs, and never root.
    let r = run(&t, &["python3", "-c", PRIVILEGES_PY]);
    // A run's uid switch happens while it still shares the host's memory: the host's dumpable
    // flag (its core dumps, its /proc files, a debugger) is left as it was.
    assert_eq!(
        dumpable(),
        host_dumpable,
        "the host's dumpable flag changed"
    );
    let line = stdout(&r).ok_or_else(|| reason(&r))?.trim().to_owned();
    assert!(
        line.starts_with("eff=0 prm=0 inh=0 bnd=0 amb=0 nnp=1 "),
        "privileges: {line}"
    );
    let run_uid = if host_uid == 0 { 65534 } else { host_uid };
    assert!(
        line.ends_with(&format!(
            "uid={run_uid} gid={}",
            if host_uid == 0 { 65534 } else { host_gid }
        )),
        "{line}"
    );

    // No device node: not in the working dir, not in the private temp directory.
    for dir in ["kmsg", "$TMPDIR/kmsg"] {
        let script = format!("mknod {dir} c 1 11 && head -c 60 {dir} && echo made-device");
        let r = run(&t, &["sh", "-c", &script]);
        assert!(!r.is_success(), "{script}: {}", reason(&r));
        assert!(!reason(&r).contains("made-device"), "{}", reason(&r));
    }
    assert!(!work.join("kmsg").exists(), "a device node was made");
    // A FIFO is no device: still allowed.
    let r = run(&t, &["sh", "-c", "mkfifo $TMPDIR/f && echo fifo-ok"]);
    assert_eq!(stdout(&r), Some("fifo-ok\n"), "{}", reason(&r));

    // No set-user-ID or set-group-ID file: by chmod, install, or a creating open.
    for script in [
        "cp /bin/sh ./sh-copy && chmod 4755 ./sh-copy",
        "cp /bin/sh ./sh-copy2 && chmod g+s ./sh-copy2",
        "cp /bin/sh ./sh-copy3 && chmod u+s ./sh-copy3",
    ] {
        let r = run(&t, &["sh", "-c", script]);
        assert!(!r.is_success(), "{script}: {}", reason(&r));
    }
    let r = run(
        &t,
        &["python3", "-c", "import os; os.close(os.open('made-suid', os.O_CREAT | os.O_WRONLY, 0o4755)); print(oct(os.stat('made-suid').st_mode))"],
    );
    assert!(
        !r.is_success(),
        "a creating open with S_ISUID: {}",
        reason(&r)
    );
    let r = run(
        &t,
        &[
            "python3",
            "-c",
            "import os, stat; os.mknod('mknod-suid', stat.S_IFREG | 0o4755); print('made')",
        ],
    );
    assert!(!r.is_success(), "mknod of a set-uid file: {}", reason(&r));
    for f in ["sh-copy", "sh-copy2", "sh-copy3", "made-suid", "mknod-suid"] {
        if let Ok(m) = std::fs::metadata(work.join(f)) {
            assert_eq!(m.permissions().mode() & 0o6000, 0, "{f} got a set-id bit");
        }
    }

    // The host's name cannot be changed (an own UTS namespace, and no capability).
    let before = hostname();
    let r = run(
        &t,
        &[
            "python3",
            "-c",
            "import socket; socket.sethostname(socket.gethostname() + 'x'); print('renamed')",
        ],
    );
    assert!(!r.is_success(), "sethostname: {}", reason(&r));
    assert_eq!(hostname(), before);

    // Root-only files stay unreadable.
    if std::path::Path::new("/etc/shadow").exists() {
        let r = run(&t, &["cat", "/etc/shadow"]);
        assert!(reason(&r).contains("Permission denied"), "{}", reason(&r));
    }
    let r = run(&t, &["cat", &private.display().to_string()]);
    if host_uid == 0 {
        assert!(reason(&r).contains("Permission denied"), "{}", reason(&r));
    } else {
        assert_eq!(stdout(&r), Some("host-only"), "{}", reason(&r));
    }

    // The working dir is written as before, and what the run makes there is the host user's.
    let r = run(
        &t,
        &["sh", "-c", "echo made > new.txt && mkdir -p sub/deeper && echo x > sub/deeper/f && echo more >> existing.txt && echo ok"],
    );
    assert_eq!(stdout(&r), Some("ok\n"), "{}", reason(&r));
    for f in [
        "new.txt",
        "sub",
        "sub/deeper",
        "sub/deeper/f",
        "existing.txt",
    ] {
        let m = std::fs::metadata(work.join(f))?;
        assert_eq!(
            (m.uid(), m.gid()),
            (host_uid, host_gid),
            "{f} is not the host user's"
        );
    }
    assert_eq!(
        std::fs::read_to_string(work.join("existing.txt"))?,
        "old\nmore\n"
    );
    // Also through its absolute path, and in the private temp directory.
    let r = run(
        &t,
        &[
            "sh",
            "-c",
            &format!(
                "echo abs > {}/abs.txt && echo t > $TMPDIR/t && cat $TMPDIR/t",
                work.display()
            ),
        ],
    );
    assert_eq!(stdout(&r), Some("t\n"), "{}", reason(&r));
    assert_eq!(std::fs::metadata(work.join("abs.txt"))?.uid(), host_uid);

    // The policy recorded is the one applied.
    let p = t.applied_policy().to_json();
    assert_eq!(p["capabilities"], "none", "{p}");
    assert_eq!(p["no_new_privs"], true);
    assert_eq!(p["namespaces"]["uts"], true, "{p}");
    assert_eq!(p["namespaces"]["ipc"], true, "{p}");
    assert_eq!(p["devices"], "mknod_denied");
    assert_eq!(p["identity"]["uid"], run_uid);
    assert_eq!(p["identity"]["working_dirs_idmapped"], host_uid == 0);
    Ok(())
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    String::from_utf8_lossy(&buf)
        .trim_end_matches('\0')
        .to_owned()
}

#[test]
fn a_run_holds_no_capability_device_host_name_or_root_only_file() -> TestResult {
    both("root_powers", root_powers)
}

/// Each floor syscall, called as an attacker would with harmless arguments, and the errno it
/// got ("ok" when it went through).
const FLOOR_PY: &str = r#"
import ctypes, ctypes.util, os, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
import platform
x86 = platform.machine() == "x86_64"
N = dict(unshare=272 if x86 else 97, add_key=248 if x86 else 217, keyctl=250 if x86 else 219,
         name_to_handle_at=303 if x86 else 264, userfaultfd=323 if x86 else 282,
         io_uring_setup=425, bpf=321 if x86 else 280, perf_event_open=298 if x86 else 241,
         mount=165 if x86 else 40, setns=308 if x86 else 268, clone3=435, syslog=103 if x86 else 116,
         settimeofday=164 if x86 else 170, open_tree=428, fsopen=430, quotactl=179 if x86 else 60,
         acct=163 if x86 else 89, swapon=167 if x86 else 224, pivot_root=155 if x86 else 41)
buf = ctypes.create_string_buffer(512)
mnt = ctypes.c_int()
name = ctypes.create_string_buffer(b".")
params = ctypes.create_string_buffer(120)
attr = ctypes.create_string_buffer(128)
res = {
 "unshare(CLONE_NEWUSER)": call(N["unshare"], 0x10000000),
 "add_key": call(N["add_key"], ctypes.addressof(ctypes.create_string_buffer(b"user")), ctypes.addressof(ctypes.create_string_buffer(b"correx-probe")), ctypes.addressof(buf), 1, -2),
 "keyctl": call(N["keyctl"], 0, -2, 0),
 "name_to_handle_at": call(N["name_to_handle_at"], -100, ctypes.addressof(name), ctypes.addressof(buf), ctypes.addressof(mnt), 0),
 "userfaultfd": call(N["userfaultfd"], 1),
 "io_uring_setup": call(N["io_uring_setup"], 1, ctypes.addressof(params)),
 "bpf": call(N["bpf"], 0, ctypes.addressof(attr), 72),
 "perf_event_open": call(N["perf_event_open"], ctypes.addressof(attr), 0, -1, -1, 0),
 "mount": call(N["mount"], 0, ctypes.addressof(name), 0, 0, 0),
 "setns": call(N["setns"], 0, 0),
 "clone3": call(N["clone3"], 0, 0),
 "syslog": call(N["syslog"], 10, 0, 0),
 "settimeofday": call(N["settimeofday"], 0, 0),
 "open_tree": call(N["open_tree"], -100, ctypes.addressof(name), 1),
 "fsopen": call(N["fsopen"], ctypes.addressof(ctypes.create_string_buffer(b"tmpfs")), 0),
 "acct": call(N["acct"], 0),
 "pivot_root": call(N["pivot_root"], ctypes.addressof(name), ctypes.addressof(name)),
}
print(" ".join(f"{k}={v}" for k, v in res.items()))
"#;

fn syscall_floor() -> TestResult {
    let work = TempDir::new("confined-floor");
    // network: true keeps the floor: it is not part of the network policy.
    for network in [false, true] {
        let t = tool(&["python3"], &[work.path()], |o| {
            o.isolation.network = network.into()
        });
        let r = run(&t, &["python3", "-c", FLOOR_PY]);
        let out = stdout(&r).ok_or_else(|| reason(&r))?.trim().to_owned();
        for item in out.split(' ') {
            let (name, errno) = item.split_once('=').ok_or("bad probe line")?;
            let want = if name == "clone3" { "ENOSYS" } else { "EPERM" };
            assert_eq!(errno, want, "{name} (network {network}): {out}");
        }
        // A thread and a subprocess still start (libc falls back from clone3 to clone).
        let r = run(
            &t,
            &["python3", "-c", "import threading, subprocess; t = threading.Thread(target=print, args=('thread',)); t.start(); t.join(); subprocess.run(['/bin/true'], check=True); print('spawned')"],
        );
        assert_eq!(stdout(&r), Some("thread\nspawned\n"), "{}", reason(&r));
    }
    // The host's SysV IPC is out of reach: a segment the host made is not found (an IPC
    // namespace of the run's) or shmget is refused (the filter, where there is none).
    // SAFETY: shmget with a fixed key and size creates or opens a segment; no memory involved.
    let key = 0x0c0d_e000 + (std::process::id() as i32 & 0xfff);
    let id = unsafe { libc::shmget(key, 4096, libc::IPC_CREAT | 0o666) };
    assert!(
        id >= 0,
        "shmget on the host: {}",
        std::io::Error::last_os_error()
    );
    let t = tool(&["python3"], &[work.path()], |_| {});
    let py = format!(
        "import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.shmget({key}, 0, 0)\nprint('found' if r >= 0 else errno.errorcode[ctypes.get_errno()])"
    );
    let r = run(&t, &["python3", "-c", &py]);
    // SAFETY: removing the segment made above.
    unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
    let out = stdout(&r).ok_or_else(|| reason(&r))?.trim().to_owned();
    assert!(
        out == "ENOENT" || out == "EPERM",
        "the host's shm segment: {out}"
    );
    Ok(())
}

#[test]
fn the_syscall_floor_holds_in_every_run() -> TestResult {
    both("syscall_floor", syscall_floor)
}

fn unix_datagrams() -> TestResult {
    use std::os::unix::net::UnixDatagram;
    let work = TempDir::new("confined-dgram");
    let path = work.join("log.sock");
    let listener = UnixDatagram::bind(&path)?;
    listener.set_nonblocking(true)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))?;
    let t = tool(&["python3"], &[work.path()], |_| {});
    let p = path.display().to_string();
    // Every way a run could address the host's datagram socket, each reported.
    let py = format!(
        r#"
import socket
path = {p:?}
out = []
def attempt(name, f):
    try:
        f()
        out.append(name + "=sent")
    except OSError as e:
        out.append(name + "=" + (e.__class__.__name__))
def dgram_sendmsg():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendmsg([b"leak-sendmsg"], [], 0, path)
def dgram_sendto():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(b"leak-sendto", path)
def pair_sendmsg():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendmsg([b"leak-pair"], [], 0, path)
def stream_pair_sendmsg():
    a, b = socket.socketpair()
    a.sendmsg([b"leak-stream"], [], 0, path)
attempt("dgram_sendmsg", dgram_sendmsg)
attempt("dgram_sendto", dgram_sendto)
attempt("pair_sendmsg", pair_sendmsg)
attempt("stream_pair_sendmsg", stream_pair_sendmsg)
def raw_sendmsg():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_RAW)
    s.sendmsg([b"leak-raw"], [], 0, path)
def raw_pair_sendmsg():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_RAW)
    a.sendmsg([b"leak-raw-pair"], [], 0, path)
attempt("raw_sendmsg", raw_sendmsg)
attempt("raw_pair_sendmsg", raw_pair_sendmsg)
a, b = socket.socketpair()
a.sendmsg([b"inside"])
out.append("stream_pair=" + b.recv(16).decode())
print(" ".join(out))
"#
    );
    let r = run(&t, &["python3", "-c", &py]);
    let out = stdout(&r).ok_or_else(|| reason(&r))?.trim().to_owned();
    assert!(!out.contains("=sent"), "a datagram left the run: {out}");
    assert!(out.contains("stream_pair=inside"), "{out}");
    std::thread::sleep(Duration::from_millis(50));
    let mut buf = [0u8; 64];
    if let Ok(n) = listener.recv(&mut buf) {
        panic!(
            "the host's datagram socket got {:?}",
            String::from_utf8_lossy(&buf[..n])
        );
    }
    Ok(())
}

#[test]
fn no_datagram_leaves_the_run() -> TestResult {
    both("unix_datagrams", unix_datagrams)
}

// ------------------------------------------------------------------ policy and construction

#[test]
fn required_refuses_a_kernel_without_the_needed_landlock_abi() {
    // Test seam: pretend the kernel offers only Landlock ABI 2 (no truncate rights).
    let options = |mode| ShellOptions {
        allowed_executables: vec!["true".into()],
        isolation: IsolationOptions {
            mode,
            pretend_landlock_abi: Some(2),
            ..IsolationOptions::default()
        },
        ..ShellOptions::default()
    };
    let refused = ShellTool::new(options(IsolationMode::Required)).expect("builds");
    let why = refused
        .refusal()
        .expect("required is refused on ABI 2")
        .to_owned();
    assert!(
        why.contains("Landlock ABI 2") && why.contains("ABI 3"),
        "{why}"
    );
    assert_eq!(refused.applied_policy().to_json()["refused"], json!(why));
    let r = run(&refused, &["true"]);
    assert!(!r.is_success(), "required ran on a pretended ABI 2");
    assert!(
        reason(&r).contains("cannot be confined as required"),
        "{}",
        reason(&r)
    );
    // best_effort runs, and records what it applied.
    let t = ShellTool::new(options(IsolationMode::BestEffort)).expect("best_effort builds");
    let p = t.applied_policy().to_json();
    assert_eq!(p["mode"], "best_effort");
    assert_eq!(p["landlock_abi"], 2);
    assert_eq!(p["filesystem"]["truncate_handled"], false);
    assert_eq!(p["network"]["landlock_tcp_denied"], false);
    assert!(run(&t, &["true"]).is_success());
    // none records that nothing is confined.
    let t = ShellTool::new(options(IsolationMode::None)).expect("none builds");
    assert_eq!(t.applied_policy().to_json()["filesystem"], Value::Null);
    assert_eq!(t.applied_policy().to_json()["network"]["allowed"], true);
}

/// On a root host, a working dir of another user's (a project owned by uid 1000) is mapped
/// for that user: the run writes its files as before, and what it makes there is theirs.
/// A working dir removed and made again after the tool was built is refused, not shown stale.
#[test]
fn a_root_hosts_run_writes_another_users_project_as_that_user() -> TestResult {
    use std::os::unix::fs::{chown, MetadataExt};
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("!!! not root: runs execute as the host user, nothing is idmapped !!!");
        return Ok(());
    }
    let base = TempDir::new("confined-owner");
    let work = base.join("project");
    std::fs::create_dir_all(work.join("src"))?;
    std::fs::write(work.join("src/main.c"), "int main;\n")?;
    for p in [work.clone(), work.join("src"), work.join("src/main.c")] {
        chown(&p, Some(1000), Some(1000))?;
    }
    let t = tool(&["sh"], &[&work], |_| {});
    let r = run(
        &t,
        &[
            "sh",
            "-c",
            "echo more >> src/main.c && mkdir out && echo built > out/a.o && echo ok",
        ],
    );
    assert_eq!(stdout(&r), Some("ok\n"), "{}", reason(&r));
    for f in ["src/main.c", "out", "out/a.o"] {
        let m = std::fs::metadata(work.join(f))?;
        assert_eq!((m.uid(), m.gid()), (1000, 1000), "{f}");
    }
    // Removed and made again: the run would see the old one, so it is refused.
    std::fs::remove_dir_all(&work)?;
    std::fs::create_dir_all(&work)?;
    let r = run(&t, &["sh", "-c", "echo x > f"]);
    assert!(!r.is_success(), "a run saw a stale working dir");
    assert!(
        reason(&r).contains("build the tool again"),
        "{}",
        reason(&r)
    );
    assert!(!work.join("f").exists());
    Ok(())
}

/// A root host whose working dir cannot be idmapped (sysfs supports no idmapped mount): the
/// kernel's refusal is detected when the tool is built, `required` refuses naming it, and
/// `best_effort` runs as root without capabilities and records why.
#[test]
fn a_working_dir_that_cannot_be_idmapped_is_detected() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("!!! not root: runs execute as the host user, nothing is idmapped !!!");
        return;
    }
    let build = |mode| {
        ShellTool::new(ShellOptions {
            allowed_executables: vec!["true".into()],
            working_roots: vec![PathBuf::from("/sys/kernel")],
            isolation: IsolationOptions {
                mode,
                ..IsolationOptions::default()
            },
            ..ShellOptions::default()
        })
        .expect("builds")
    };
    let refused = build(IsolationMode::Required);
    let why = refused.refusal().expect("required is refused").to_owned();
    assert!(
        why.contains("idmapped") && why.contains("/sys/kernel"),
        "{why}"
    );
    assert!(!run(&refused, &["true"]).is_success());
    let t = build(IsolationMode::BestEffort);
    assert_eq!(t.refusal(), None);
    let p = t.applied_policy().to_json();
    assert_eq!(p["identity"]["run_as"], "host_root", "{p}");
    assert_eq!(p["identity"]["uid"], 0);
    assert!(
        p["identity"]["fallback"]
            .as_str()
            .is_some_and(|f| f.contains("/sys/kernel")),
        "{p}"
    );
    assert_eq!(p["capabilities"], "none");
    let r = run(&t, &["true"]);
    assert!(r.is_success(), "{}", reason(&r));
    // Asked for, root keeps its uid (without capabilities) and nothing is idmapped.
    let host = ShellTool::new(ShellOptions {
        allowed_executables: vec!["true".into()],
        isolation: IsolationOptions {
            run_as: correx::RunAs::Host,
            ..IsolationOptions::default()
        },
        ..ShellOptions::default()
    })
    .expect("builds");
    assert_eq!(
        host.applied_policy().to_json()["identity"]["run_as"],
        "host_root"
    );
    assert_eq!(
        host.applied_policy().to_json()["identity"]["working_dirs_idmapped"],
        false
    );
    assert!(run(&host, &["true"]).is_success());
    // Its start directory, a working dir or its temp directory, has a path it can read back
    // (with nothing idmapped it gets no mount namespace of its own, where a directory opened
    // by the host would be unreachable).
    let work = TempDir::new("host-cwd");
    let canonical = std::fs::canonicalize(work.path()).expect("canonical");
    for (dirs, want) in [
        (
            vec![canonical.clone()],
            Some(canonical.display().to_string()),
        ),
        (vec![], None),
    ] {
        let t = ShellTool::new(ShellOptions {
            allowed_executables: vec!["pwd".into()],
            working_roots: dirs,
            isolation: IsolationOptions {
                run_as: correx::RunAs::Host,
                ..IsolationOptions::default()
            },
            ..ShellOptions::default()
        })
        .expect("builds");
        let r = run(&t, &["pwd", "-P"]);
        let out = stdout(&r).unwrap_or_else(|| panic!("pwd failed: {}", reason(&r)));
        match &want {
            Some(w) => assert_eq!(out.trim(), w),
            None => assert!(out.trim().starts_with('/'), "{out}"),
        }
    }
}

#[test]
fn the_started_event_records_the_policy_applied() -> TestResult {
    use correx::{
        AutoApprove, DispatchingToolExecutor, EventStore, SandboxedToolExecutor, SqliteEventStore,
        Tier, ToolExecutor, ToolRegistry,
    };
    use std::sync::Arc;
    let dir = TempDir::new("confined-event");
    let work = dir.join("work");
    std::fs::create_dir_all(&work)?;
    let store = Arc::new(SqliteEventStore::open(dir.join("events.db"))?);
    let shell = tool(&["true"], &[&work], |_| {});
    let expected = shell.applied_policy().to_json().clone();
    let tools = vec![Arc::new(shell) as Arc<dyn Tool>];
    let exec = SandboxedToolExecutor::new(
        Arc::new(DispatchingToolExecutor::new(ToolRegistry::build(
            tools.clone(),
        )?)),
        ToolRegistry::build(tools)?,
        Arc::new(AutoApprove::up_to(Tier::T3)),
        store.clone() as Arc<dyn EventStore>,
        dir.join("sandbox"),
    )?;
    let r = exec.execute(&req(json!({"argv": ["true"]})));
    assert!(r.is_success(), "{}", reason(&r));
    let stream = correx::session_stream("confined");
    let events = store.read_stream(&stream, 0, 100)?;
    let started = events
        .iter()
        .find(|e| e.type_id == "tool.execution_started")
        .ok_or("no started event")?;
    let recorded = &started.payload["isolation"];
    assert_eq!(recorded, &expected);
    assert_eq!(recorded["mode"], "required");
    assert!(recorded["landlock_abi"].as_u64().unwrap_or(0) >= 3);
    assert_eq!(recorded["network"]["seccomp_af_unix_only"], true);
    assert_eq!(
        recorded["filesystem"]["read_write"][0],
        std::fs::canonicalize(&work)?.display().to_string()
    );
    Ok(())
}

#[test]
fn a_replaced_allowed_executable_is_refused() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("confined-pin");
    let script = dir.join("build.sh");
    std::fs::write(&script, "#!/bin/sh\necho original\n")?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    let s = script.display().to_string();
    let t = tool(&[&s], &[dir.path()], |_| {});
    let r = run(&t, &[&s]);
    assert_eq!(stdout(&r), Some("original\n"), "{}", reason(&r));
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&script, "#!/bin/sh\necho replaced-and-run\n")?;
    let r = run(&t, &[&s]);
    assert!(!r.is_success(), "a rewritten executable ran");
    assert!(reason(&r).contains("changed since"), "{}", reason(&r));
    assert_eq!(r.error_kind(), Some(correx::ToolErrorKind::NotAllowed));
    Ok(())
}

#[test]
fn bad_settings_are_refused_at_construction() {
    let build = |f: &dyn Fn(&mut ShellOptions)| {
        let mut o = ShellOptions {
            allowed_executables: vec!["true".into()],
            ..ShellOptions::default()
        };
        f(&mut o);
        ShellTool::new(o).map(|_| ()).map_err(|e| e.to_string())
    };
    assert!(build(&|o| o.timeout = Duration::MAX).is_err_and(|e| e.contains("timeout_ms")));
    let env = |k: &str, v: &str| {
        let (k, v) = (k.to_owned(), v.to_owned());
        build(&move |o| {
            o.env.insert(k.clone(), v.clone());
        })
    };
    assert!(env("LANG", "C\0UTF-8").is_err_and(|e| e.contains("NUL")));
    for name in ["LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "ENV"] {
        assert!(env(name, "/x").is_err(), "{name} was accepted");
    }
    for name in [
        "GITHUB_PAT",
        "AWS_CREDENTIALS",
        "DB_PASSWD",
        "SESSION_COOKIE",
        "MY_PRIVATE",
        "DATABASE_URL",
    ] {
        assert!(
            env(name, "x").is_err_and(|e| e.contains("secret")),
            "{name} was accepted"
        );
    }
    assert!(env("UPSTREAM", "https://me:hunter2@example.test/repo").is_err());
    assert!(env("UPSTREAM", "https://example.test/a@b").is_ok());
    assert!(env("LANG", "C.UTF-8").is_ok());
}

/// A host that ignores SIGCHLD (so the kernel reaps its children at once) still gets exit codes.
#[test]
fn a_host_ignoring_sigchld_still_gets_exit_statuses() -> TestResult {
    crate::util::assert_child_passes(
        &mut child_test("confined::sigchld_child"),
        "sigchld ok",
        "the SIGCHLD-ignoring host",
    )?;
    Ok(())
}

#[test]
#[ignore = "helper: run by a_host_ignoring_sigchld_still_gets_exit_statuses"]
fn sigchld_child() {
    if !is_child() {
        return;
    }
    // SAFETY: setting a signal disposition to SIG_IGN, as such a host would.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_IGN);
    }
    let work = TempDir::new("confined-sigchld");
    let t = tool(&["sh", "true"], &[work.path()], |_| {});
    assert!(run(&t, &["true"]).is_success());
    let r = run(&t, &["sh", "-c", "exit 3"]);
    assert!(reason(&r).contains("exited with code 3"), "{}", reason(&r));
    println!("sigchld ok");
}

#[test]
fn file_tools_refuse_to_rewrite_an_allowed_executable() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("confined-protect");
    let script = dir.join("build.sh");
    std::fs::write(&script, "#!/bin/sh\necho build\n")?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    std::fs::hard_link(&script, dir.join("alias.sh"))?;
    let config = correx::ToolConfig::from_value(&json!({
        "shell": {"enabled": true, "allowed_executables": [script], "working_dirs": [dir.path()]},
        "file_write": {"enabled": true, "allowed_paths": [dir.path()]},
        "file_edit": {"enabled": true, "allowed_paths": [dir.path()]},
    }))?;
    let registry = correx::build_registry(&config)?;
    let call = |tool: &str, params: Value| {
        let r = ToolRequest::new(
            SessionId::from("confined"),
            tool,
            params.as_object().cloned().unwrap_or_default(),
        );
        registry.resolve(tool).map(|t| t.execute(&r))
    };
    for (tool, params) in [
        (
            "file_write",
            json!({"operation": "write", "path": "build.sh", "content": "rm -rf ~"}),
        ),
        (
            "file_write",
            json!({"operation": "write", "path": "alias.sh", "content": "rm -rf ~"}),
        ),
        (
            "file_write",
            json!({"operation": "delete", "path": "build.sh"}),
        ),
        (
            "file_edit",
            json!({"operation": "append", "path": "build.sh", "content": "rm -rf ~"}),
        ),
        (
            "file_edit",
            json!({"operation": "patch", "patch":
            "--- build.sh\n+++ build.sh\n@@ -1,2 +1,2 @@\n #!/bin/sh\n-echo build\n+rm -rf ~\n"}),
        ),
    ] {
        let r = call(tool, params.clone()).ok_or("tool missing")?;
        assert!(
            reason(&r).contains("allowed to run"),
            "{tool} {params}: {}",
            reason(&r)
        );
    }
    assert_eq!(std::fs::read_to_string(&script)?, "#!/bin/sh\necho build\n");
    // Other files in the same root are written as before.
    let r = call(
        "file_write",
        json!({"operation": "write", "path": "notes.txt", "content": "ok"}),
    )
    .ok_or("tool missing")?;
    assert!(r.is_success(), "{}", reason(&r));
    Ok(())
}

/// The supervisor sleeps while its program runs: a 1 s `sleep` costs the run's processes next
/// to no CPU time (a busy-waiting supervisor would spend about a second).
#[test]
fn a_waiting_run_costs_no_cpu() -> TestResult {
    crate::util::assert_child_passes(
        &mut child_test("confined::cpu_child"),
        "cpu ok",
        "the waiting run",
    )?;
    Ok(())
}

#[test]
#[ignore = "helper: run by a_waiting_run_costs_no_cpu"]
fn cpu_child() {
    if !is_child() {
        return;
    }
    let cpu = || {
        // SAFETY: getrusage writes one rusage struct on this frame.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
        let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
        t(u.ru_utime) + t(u.ru_stime)
    };
    let work = TempDir::new("confined-cpu");
    let t = tool(&["sleep"], &[work.path()], |_| {});
    let before = cpu();
    let r = run(&t, &["sleep", "1"]);
    assert!(r.is_success(), "{}", reason(&r));
    let spent = cpu() - before;
    assert!(
        spent < 0.2,
        "the run's processes used {spent:.3} s of CPU for a 1 s sleep"
    );
    println!("cpu ok ({spent:.3} s)");
}
