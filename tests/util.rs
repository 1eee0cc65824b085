//! Helpers shared by the integration tests.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A temp directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let base = std::env::temp_dir().join(format!(
            "correx-test-{tag}-{}-{}",
            std::process::id(),
            correx::EventId::random()
        ));
        std::fs::create_dir_all(&base).expect("create temp dir");
        TempDir(base)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }

    pub fn join(&self, p: impl AsRef<std::path::Path>) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A command that re-runs this test binary with only the ignored helper test `name`, which
/// reads its instructions from `CORREX_CHILD_*` environment variables.
pub fn child_test(name: &str) -> Command {
    // This very binary, through /proc: a process that dropped to nobody may not search the
    // directories on its path (a clean clone under a 0700 temp dir).
    let exe = std::path::PathBuf::from("/proc/self/exe");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--ignored",
        "--exact",
        name,
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env("CORREX_CHILD", "1")
    .stdin(Stdio::null());
    cmd
}

/// Whether this process is a child started by [`child_test`].
pub fn is_child() -> bool {
    std::env::var_os("CORREX_CHILD").is_some()
}

pub use correx::LlamaInstall;

/// Finds the install; in CI a missing install fails the test, elsewhere the test is skipped
/// loudly.
pub fn llama_install() -> Option<LlamaInstall> {
    let found = LlamaInstall::locate();
    if found.is_none() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("llama-server or the model is not installed; CI must run scripts/install-llama.sh first");
        }
        eprintln!(
            "\n!!! SKIPPING: llama-server/model not installed; run scripts/install-llama.sh !!!\n"
        );
    }
    found
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A llama-server started for one test; killed and reaped on drop.
pub struct TestServer {
    child: std::process::Child,
    pub port: u16,
}

impl TestServer {
    pub fn start(install: &LlamaInstall) -> TestServer {
        Self::start_with(install, &["--no-jinja", "--chat-template", "gemma"])
    }

    /// A server with these arguments after the model, port, context and threads.
    pub fn start_with(install: &LlamaInstall, args: &[&str]) -> TestServer {
        use std::os::unix::process::CommandExt;
        let port = free_port();
        let mut cmd = Command::new(&install.server);
        cmd.args(["--model"])
            .arg(&install.model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--ctx-size", "2048", "--threads", "2"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl is async-signal-safe; the server dies if this test thread does.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn llama-server");
        let server = TestServer { child, port };
        server.wait_healthy();
        server
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn wait_healthy(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if let Ok(status) = raw_http(self.port, "GET", "/health", "").map(|(s, _)| s) {
                if status == 200 {
                    return;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("test llama-server did not become healthy");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A bare HTTP/1.1 request on a fresh connection; returns (status, body).
pub fn raw_http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(120)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// Drops this (root) test process to uid and gid 65534 (nobody), as an unprivileged host runs.
pub fn become_nobody() {
    const NOBODY: u32 = 65534;
    // SAFETY: plain credential syscalls with constant arguments; glibc applies them to every
    // thread of the process.
    unsafe {
        assert_eq!(libc::setgroups(0, std::ptr::null()), 0, "setgroups");
        assert_eq!(libc::setgid(NOBODY), 0, "setgid");
        assert_eq!(libc::setuid(NOBODY), 0, "setuid");
        // Changing credentials cleared the dumpable flag (its /proc files now belong to root);
        // a process started by an ordinary user has it set.
        assert_eq!(libc::prctl(libc::PR_SET_DUMPABLE, 1), 0, "dumpable");
    }
}

/// Runs a child test process and asserts that it exited 0 and printed `marker`; `what` names
/// it in the failure, with both its streams.
pub fn assert_child_passes(cmd: &mut Command, marker: &str, what: &str) -> std::io::Result<()> {
    let out = cmd.output()?;
    let text = both_streams(&out);
    assert!(
        out.status.success() && text.contains(marker),
        "{what}:\n{text}"
    );
    Ok(())
}

/// A child's stdout and stderr, one after the other, as text (for its assertion messages).
pub fn both_streams(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The signals pending for process `pid` (its own and its group's), as a bit mask.
pub fn pending_signals(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| {
            s.lines()
                .filter_map(|l| {
                    l.strip_prefix("ShdPnd:")
                        .or_else(|| l.strip_prefix("SigPnd:"))
                })
                .filter_map(|v| u64::from_str_radix(v.trim(), 16).ok())
                .fold(0, |a, b| a | b)
        })
        .unwrap_or(0)
}

/// What a test's event store does to an append before it reaches the real log: wait, or
/// refuse it with an error.
pub trait BeforeAppend: Send + Sync {
    fn before_append(&self, events: &[correx::NewEvent]) -> Result<(), correx::EventStoreError>;
}

/// A real store whose appends pass `hook` first: a log that stalls or refuses; reads go
/// straight through.
pub struct HookedStore<H> {
    pub inner: std::sync::Arc<correx::SqliteEventStore>,
    pub hook: H,
}

impl<H: BeforeAppend> correx::EventStore for HookedStore<H> {
    fn append(
        &self,
        stream: &str,
        expected: correx::ExpectedVersion,
        events: &[correx::NewEvent],
    ) -> Result<correx::AppendResult, correx::EventStoreError> {
        self.hook.before_append(events)?;
        self.inner.append(stream, expected, events)
    }

    fn read_stream(
        &self,
        stream: &str,
        from_version: u64,
        max: usize,
    ) -> Result<Vec<correx::RecordedEvent>, correx::EventStoreError> {
        self.inner.read_stream(stream, from_version, max)
    }

    fn read_all(
        &self,
        from_position: u64,
        max: usize,
    ) -> Result<Vec<correx::RecordedEvent>, correx::EventStoreError> {
        self.inner.read_all(from_position, max)
    }

    fn last_position(&self) -> Result<u64, correx::EventStoreError> {
        self.inner.last_position()
    }
}

/// A fresh, empty PostgreSQL database on the test server, as a `postgres://` URL over loopback
/// TCP (password from `PGPASSFILE`, which the test script exports). `None` when no test server
/// is configured (`CORREX_TEST_PG_URL` unset), after saying so on stderr; in CI (`CI` set) a
/// missing server fails the test instead, so a green run never skipped it silently.
pub fn fresh_pg(tag: &str) -> Option<String> {
    let Ok(base) = std::env::var("CORREX_TEST_PG_URL") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the PostgreSQL tests: scripts/test.sh starts the server"
        );
        eprintln!(
            "SKIPPED (PostgreSQL part of {tag}): no test server; run scripts/test.sh, or set \
             CORREX_TEST_PG_URL, CORREX_TEST_PG_SOCKET_URL and PGPASSFILE"
        );
        return None;
    };
    let admin = std::env::var("CORREX_TEST_PG_SOCKET_URL").expect("CORREX_TEST_PG_SOCKET_URL");
    let name = format!(
        "t_{}_{}",
        tag.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(30)
            .collect::<String>(),
        correx::EventId::random().to_string().replace('-', "")
    )
    .to_ascii_lowercase();
    connect_socket(&admin)
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("create a test database");
    let (server, _db) = base.rsplit_once('/').expect("a URL with a database");
    Some(format!("{server}/{name}"))
}

/// A bare client on the test server's UNIX socket (trusted, no password), for what the tests
/// do behind correx's back.
pub fn connect_socket(socket_url: &str) -> postgres::Client {
    <postgres::Config as std::str::FromStr>::from_str(socket_url)
        .expect("the socket URL")
        .connect(postgres::NoTls)
        .expect("connect to the test server's socket")
}

/// The same database as `url` reached through the test server's UNIX socket.
pub fn pg_socket_url(url: &str) -> String {
    let db = url.rsplit('/').next().unwrap_or("correx");
    let socket = std::env::var("CORREX_TEST_PG_SOCKET_URL").expect("CORREX_TEST_PG_SOCKET_URL");
    socket.replacen("@/correx?", &format!("@/{db}?"), 1)
}

/// Every log location a conformance test runs against: a SQLite file in `dir`, and a fresh
/// PostgreSQL database when a test server is there (see [`fresh_pg`]).
pub fn log_locations(dir: &TempDir, tag: &str) -> Vec<String> {
    let mut out = vec![dir.join("e.db").display().to_string()];
    out.extend(fresh_pg(tag));
    out
}

/// Opens the log at `location` (a path or a URL) with the default options.
pub fn open_log(
    location: &str,
) -> Result<std::sync::Arc<correx::EventLog>, correx::EventStoreError> {
    correx::EventLog::open(location, correx::StoreOptions::default()).map(std::sync::Arc::new)
}

/// A wheel pip can download from a local index: one module, its metadata and record.
pub fn write_wheel(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let script = format!(
        r#"
import zipfile
with zipfile.ZipFile("{}/tinypkg-1.0-py3-none-any.whl", "w") as z:
    z.writestr("tinypkg.py", "X = 1\n")
    z.writestr("tinypkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n")
    z.writestr("tinypkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr("tinypkg-1.0.dist-info/RECORD", "")
"#,
        dir.display()
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .output()?;
    assert!(out.status.success(), "{out:?}");
    Ok(())
}

/// A small deterministic generator: a battery prints its seed.
pub struct Rng(pub u64);

impl Rng {
    /// A generator seeded from the clock (never 0).
    pub fn from_clock() -> Rng {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Rng(nanos | 1)
    }

    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
