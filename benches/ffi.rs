//! `cargo bench --bench ffi`: a T1 `file_read` through the C ABI (JSON in and out included)
//! against the same sandboxed call from Rust, alternating; the same call through the Java API
//! (JNI, on JDK 17) against the C ABI, alternating; then the stripped cdylib's size and
//! the resident memory of a C host that opened a runtime (no model loaded).

use correx::ffi::*;
use correx::{DenyAll, Runtime, RuntimeConfig, SessionId, ToolExecutor, ToolRequest};
use serde_json::json;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Rounds of the Java benchmark (java/bench/FileReadBench.java) alternating with rounds of
/// `c_call`: each side's per-call time per round.
fn java_rounds(
    root: &Path,
    config: &str,
    c_call: &dyn Fn(),
) -> Result<(Vec<Duration>, Vec<Duration>), Box<dyn std::error::Error>> {
    use std::io::{BufRead, Write};
    const ROUNDS: usize = 15;
    const CALLS: usize = 40;
    let built = std::process::Command::new("make")
        .args(["-s", "-C", "java", "build/test.stamp"])
        .current_dir(root)
        .status()?;
    if !built.success() {
        return Err("building the Java library (make -C java) failed; it needs a JDK 17".into());
    }
    let jdk = std::process::Command::new("make")
        .args(["-s", "-C", "java", "print-jdk17"])
        .current_dir(root)
        .output()?;
    let java = PathBuf::from(String::from_utf8_lossy(&jdk.stdout).trim()).join("bin/java");
    let mut child = std::process::Command::new(java)
        .args(["-cp", "java/build/correx.jar:java/build/test"])
        .arg("dev.correx.bench.FileReadBench")
        .args([config, &ROUNDS.to_string(), &CALLS.to_string()])
        .current_dir(root)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut to_java = child.stdin.take().ok_or("no stdin")?;
    let mut from_java = std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let ready = from_java
        .next()
        .ok_or("the Java bench ended before its rounds")??;
    if ready != "ready" {
        return Err(format!("the Java bench said {ready:?}").into());
    }
    let (mut java, mut c) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..CALLS {
            c_call();
        }
        c.push(t.elapsed() / CALLS as u32);
        writeln!(to_java, "go")?;
        let line = from_java.next().ok_or("the Java bench ended early")??;
        let us: f64 = line
            .strip_prefix("round_us: ")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("the Java bench said {line:?}"))?;
        java.push(Duration::from_secs_f64(us / 1e6));
    }
    drop(to_java);
    if !child.wait()?.success() {
        return Err("the Java bench failed".into());
    }
    Ok((java, c))
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

    let round = |f: &dyn Fn()| {
        let t = Instant::now();
        for _ in 0..40 {
            f();
        }
        t.elapsed() / 40
    };
    let (mut rust, mut c) = (Vec::new(), Vec::new());
    for i in 0..61 {
        // Who goes first alternates too.
        if i % 2 == 0 {
            rust.push(round(&rust_call));
            c.push(round(&c_call));
        } else {
            c.push(round(&c_call));
            rust.push(round(&rust_call));
        }
    }
    // Java side: the same call through the Java API (JNI), in a JDK 17 process whose rounds
    // alternate with rounds of the C call here.
    let java_config = config.replace("events.db", "events-java.db");
    let (java, c_vs_java) = java_rounds(root, &java_config, &c_call)?;
    // SAFETY: freed once, after every call returned.
    unsafe { correx_runtime_free(rt) };
    drop(rust_rt);
    // Each round's two sides ran back to back, under the same disk mood: the ratios are the
    // medians of the rounds' ratios.
    let paired = |a: &[Duration], b: &[Duration]| {
        let mut r: Vec<f64> = a
            .iter()
            .zip(b)
            .map(|(x, y)| x.as_secs_f64() / y.as_secs_f64())
            .collect();
        r.sort_by(|x, y| x.total_cmp(y));
        r[r.len() / 2]
    };
    let (ffi_ratio, jni_ratio) = (paired(&c, &rust), paired(&java, &c_vs_java));
    let (rust, c) = (median(rust), median(c));
    let (java, c_vs_java) = (median(java), median(c_vs_java));
    println!("java_file_read_us: {:.1}", java.as_secs_f64() * 1e6);
    println!(
        "c_file_read_us_beside_java: {:.1}",
        c_vs_java.as_secs_f64() * 1e6
    );
    println!("jni_overhead_ratio: {jni_ratio:.3}");
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
    println!("ffi_overhead_ratio: {ffi_ratio:.3}");
    Ok(())
}
