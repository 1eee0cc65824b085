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

    pub fn join(&self, p: &str) -> PathBuf {
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
    let exe = std::env::current_exe().expect("current exe");
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
