//! `cargo bench --bench ffi`: a T1 `file_read` through the C ABI (JSON in and out included)
//! against the same sandboxed call from Rust, alternating; then the stripped cdylib's size and
//! the resident memory of a C host that opened a runtime (no model loaded).

use correx::ffi::*;
use correx::{DenyAll, Runtime, RuntimeConfig, SessionId, ToolExecutor, ToolRequest};
use serde_json::json;
use std::ffi::CString;
use std::path::Path;
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("correx-bench-ffi-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("files"))?;
    std::fs::write(dir.join("files/data.txt"), "z".repeat(4096))?;
    let config = json!({
        "v": 1,
        "event_log": dir.join("events.db"),
        "sandbox_root": dir.join("sb"),
        "tools": {"file_read": {"enabled": true, "allowed_paths": [dir.join("files")]}},
    })
    .to_string();

    // Rust side: the sandboxed executor, as a Rust host calls it.
    let rust_rt = Runtime::new(&RuntimeConfig::from_json(&config)?, Arc::new(DenyAll))?;
    let params = json!({"operation": "read", "path": "data.txt"});
    let rust_call = || {
        let req = ToolRequest::new(
            SessionId::from("b"),
            "file_read",
            params.as_object().cloned().unwrap_or_default(),
        );
        assert!(rust_rt.executor().execute(&req).is_success());
    };

    // C side: the same call through the exported ABI, JSON in and out.
    let c_config = CString::new(config.replace("events.db", "events-c.db"))?;
    let mut rt = ptr::null_mut();
    // SAFETY: valid string and out-param.
    assert_eq!(
        unsafe { correx_runtime_new(c_config.as_ptr(), &mut rt, ptr::null_mut()) },
        CORREX_OK
    );
    let request = CString::new(
        r#"{"v":1,"session_id":"b","tool_name":"file_read","parameters":{"operation":"read","path":"data.txt"}}"#,
    )?;
    let c_call = || {
        let mut out = ptr::null_mut();
        // SAFETY: live runtime, valid strings and out-param.
        let rc = unsafe { correx_tool_execute(rt, request.as_ptr(), &mut out, ptr::null_mut()) };
        assert_eq!(rc, CORREX_OK);
        // SAFETY: a string correx returned, freed once.
        unsafe { correx_string_free(out) };
    };

    let (mut rust, mut c) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        let t = Instant::now();
        for _ in 0..40 {
            rust_call();
        }
        rust.push(t.elapsed() / 40);
        let t = Instant::now();
        for _ in 0..40 {
            c_call();
        }
        c.push(t.elapsed() / 40);
    }
    // SAFETY: freed once, after every call returned.
    unsafe { correx_runtime_free(rt) };
    drop(rust_rt);
    let (rust, c) = (median(rust), median(c));
    println!("rust_file_read_us: {:.1}", rust.as_secs_f64() * 1e6);
    println!("ffi_file_read_us: {:.1}", c.as_secs_f64() * 1e6);

    // The cdylib, stripped.
    let so = root.join("target/release/libcorrex.so");
    let status = std::process::Command::new("cargo")
        .args(["build", "--release", "--lib", "--quiet"])
        .current_dir(root)
        .status()?;
    if status.success() && so.exists() {
        let stripped = dir.join("libcorrex.stripped.so");
        std::fs::copy(&so, &stripped)?;
        if std::process::Command::new("strip")
            .arg(&stripped)
            .status()?
            .success()
        {
            println!(
                "cdylib_stripped_bytes: {}",
                std::fs::metadata(&stripped)?.len()
            );
        }
    }
    // A C host's resident memory after opening a runtime.
    let built = std::process::Command::new("make")
        .args(["-s", "-C", "examples/c", "build/rss"])
        .current_dir(root)
        .status()?;
    if built.success() {
        let out = std::process::Command::new(root.join("examples/c/build/rss")).output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(kb) = text.split_whitespace().nth(1) {
            println!("c_host_rss_kib_after_runtime_new: {kb}");
        }
    }
    std::fs::remove_dir_all(&dir)?;
    println!(
        "ffi_overhead_ratio: {:.3}",
        c.as_secs_f64() / rust.as_secs_f64()
    );
    Ok(())
}
