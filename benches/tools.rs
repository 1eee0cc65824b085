//! `cargo bench --bench tools`: the built-in tools against the bare std calls they wrap, in one
//! run, alternating the two so drift hits both alike.

use correx::{
    Allowlist, FileReadTool, FileWriteTool, IsolationMode, IsolationOptions, NetworkPolicy,
    SessionId, ShellOptions, ShellTool, Tool, ToolRequest,
};
use serde_json::json;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn req(tool: &str, params: serde_json::Value) -> ToolRequest {
    ToolRequest::new(
        SessionId::from("bench"),
        tool,
        params.as_object().cloned().unwrap_or_default(),
    )
}

/// The view a confined run sees: where it is built (`tool`, once when the tool is built;
/// `run`, by each run's supervisor), what building it costs (`view_build_ms`: a tool built
/// with its view against one built without, per tool; a run's share is in the spawn ratio),
/// and what the view and its own /proc cost a run (`view_spawn_ratio`: a run with against one
/// without, alternating).
fn view(confined: &ShellTool) -> Result<(), Box<dyn std::error::Error>> {
    let v = confined.applied_policy().to_json()["view"].clone();
    println!("view_built: {}", v["built"].as_str().unwrap_or("?"));
    println!("view_proc: {}", v["proc"].as_str().unwrap_or("?"));
    let build = |no_view: bool| -> Result<Duration, correx::ToolError> {
        let mut times = Vec::new();
        for _ in 0..15 {
            let t = Instant::now();
            let mut o = ShellOptions {
                allowed_executables: vec!["true".into()],
                ..ShellOptions::default()
            };
            o.isolation.force_no_view = no_view;
            drop(ShellTool::new(o)?);
            times.push(t.elapsed());
        }
        times.sort();
        Ok(times[times.len() / 2])
    };
    let (with, without) = (build(false)?, build(true)?);
    println!(
        "view_build_ms: {:.2}",
        (with.as_secs_f64() - without.as_secs_f64()).max(0.0) * 1e3
    );
    let mut o = ShellOptions {
        allowed_executables: vec!["true".into()],
        ..ShellOptions::default()
    };
    o.isolation.force_no_view = true;
    let bare = ShellTool::new(o)?;
    let true_req = req("shell", json!({"argv": ["/bin/true"]}));
    let (ours, theirs) = compare(
        15,
        40,
        || assert!(confined.execute(&true_req).is_success()),
        || assert!(bare.execute(&true_req).is_success()),
    );
    println!(
        "view_spawn_ratio: {:.3}",
        ours.as_secs_f64() / theirs.as_secs_f64()
    );
    Ok(())
}

/// Alternates `ours` and `raw` in blocks and returns (median ours, median raw) per call.
fn compare(
    rounds: usize,
    per_round: usize,
    mut ours: impl FnMut(),
    mut raw: impl FnMut(),
) -> (Duration, Duration) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..per_round {
            raw();
        }
        b.push(t.elapsed() / per_round as u32);
        let t = Instant::now();
        for _ in 0..per_round {
            ours();
        }
        a.push(t.elapsed() / per_round as u32);
    }
    a.sort();
    b.sort();
    (a[a.len() / 2], b[b.len() / 2])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("correx-bench-tools-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    // The shell without kernel confinement (still fenced and contained), and the default one:
    // Landlock, the seccomp filter, limits, a private temp directory.
    let shell_with = |mode: IsolationMode, max_processes: bool| {
        let mut isolation = IsolationOptions {
            mode,
            ..IsolationOptions::default()
        };
        if !max_processes {
            isolation.limits.max_processes = None;
        }
        ShellTool::new(ShellOptions {
            allowed_executables: vec!["true".into()],
            isolation,
            ..ShellOptions::default()
        })
    };
    let raw_true = || {
        let out = std::process::Command::new("/bin/true")
            .output()
            .expect("spawn");
        assert!(out.status.success());
    };
    let true_req = req("shell", json!({"argv": ["/bin/true"]}));
    // /bin/true through `tool` against a raw spawn, alternating: (ours, raw) per call.
    let against_raw = |tool: &ShellTool| {
        compare(
            15,
            40,
            || assert!(tool.execute(&true_req).is_success()),
            raw_true,
        )
    };
    let ratio = |(ours, raw): (Duration, Duration)| ours.as_secs_f64() / raw.as_secs_f64();
    let shell = shell_with(IsolationMode::None, true)?;
    let (ours, raw) = against_raw(&shell);
    println!("shell_spawn_us: {:.1}", ours.as_secs_f64() * 1e6);
    println!("raw_spawn_us: {:.1}", raw.as_secs_f64() * 1e6);
    let shell_ratio = ratio((ours, raw));

    let confined = shell_with(IsolationMode::Required, true)?;
    println!(
        "confined_process_bound: {}",
        confined.applied_policy().to_json()["limits"]["process_bound"]
            .as_str()
            .unwrap_or("?")
    );
    let (ours, raw) = against_raw(&confined);
    println!("confined_shell_spawn_us: {:.1}", ours.as_secs_f64() * 1e6);
    println!("confined_raw_spawn_us: {:.1}", raw.as_secs_f64() * 1e6);
    let confined_ratio = ratio((ours, raw));
    // The same without a process bound: what a per-run pids cgroup (root on cgroup v1, where
    // joining one is a migration) costs shows as the difference.
    let unbounded = shell_with(IsolationMode::Required, false)?;
    println!(
        "confined_without_process_bound_ratio: {:.3}",
        ratio(against_raw(&unbounded))
    );
    let n = 2000;
    let t = Instant::now();
    for _ in 0..n {
        confined.build_confinement_for_bench()?;
    }
    println!(
        "ruleset_and_filter_build_us: {:.1}",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    );

    view(&confined)?;

    network(against_raw_rounds())?;

    let content = "x".repeat(4096);
    std::fs::write(dir.join("data.txt"), &content)?;
    let read = FileReadTool::new(std::slice::from_ref(&dir))?;
    let read_req = req(
        "file_read",
        json!({"operation": "read", "path": "data.txt"}),
    );
    let path = dir.join("data.txt");
    let (ours, raw) = compare(
        15,
        2000,
        || assert!(read.execute(&read_req).is_success()),
        || assert_eq!(std::fs::read(&path).expect("read").len(), 4096),
    );
    println!("file_read_4k_us: {:.2}", ours.as_secs_f64() * 1e6);
    println!("raw_read_4k_us: {:.2}", raw.as_secs_f64() * 1e6);
    let read_ratio = ours.as_secs_f64() / raw.as_secs_f64();

    let write = FileWriteTool::new(std::slice::from_ref(&dir))?;
    let write_req = req(
        "file_write",
        json!({"operation": "write", "path": "out.txt", "content": content}),
    );
    let raw_target = dir.join("raw.txt");
    let raw_tmp = dir.join(".raw.txt.tmp");
    let (ours, raw) = compare(
        9,
        60,
        || assert!(write.execute(&write_req).is_success()),
        || {
            // The same durability as the tool: write a temp file, flush its data, rename.
            let mut f = std::fs::File::create(&raw_tmp).expect("create");
            f.write_all(content.as_bytes()).expect("write");
            f.sync_data().expect("sync");
            std::fs::rename(&raw_tmp, &raw_target).expect("rename");
        },
    );
    println!("file_write_4k_us: {:.1}", ours.as_secs_f64() * 1e6);
    println!("raw_write_4k_us: {:.1}", raw.as_secs_f64() * 1e6);
    let write_ratio = ours.as_secs_f64() / raw.as_secs_f64();

    std::fs::remove_dir_all(&dir)?;
    println!("shell_spawn_ratio: {shell_ratio:.3}");
    println!("confined_shell_spawn_ratio: {confined_ratio:.3}");
    println!("read_ratio: {read_ratio:.3}");
    println!("write_ratio: {write_ratio:.3}");
    Ok(())
}

/// Rounds of the network spawn comparison.
fn against_raw_rounds() -> usize {
    15
}

/// A loopback server that answers every request with `size` bytes.
fn bulk_server(size: usize) -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        let chunk = vec![0u8; 1 << 20];
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut head = Vec::new();
            let mut b = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&b[..n]),
                }
            }
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
            );
            let mut left = size;
            while left > 0 {
                let n = left.min(chunk.len());
                if conn.write_all(&chunk[..n]).is_err() {
                    break;
                }
                left -= n;
            }
        }
    });
    Ok(port)
}

/// Network by name: what a run with an allowlist costs to start (its network namespace, the
/// proxy's listener) over one with no network, and a 100 MiB download through the proxy
/// against the same download made directly (a run with `network: true`).
fn network(rounds: usize) -> Result<(), Box<dyn std::error::Error>> {
    const SIZE: usize = 100 << 20;
    let port = bulk_server(SIZE)?;
    let tool = |network: NetworkPolicy| {
        ShellTool::new(ShellOptions {
            allowed_executables: vec!["true".into(), "curl".into()],
            timeout: Duration::from_secs(60),
            isolation: IsolationOptions {
                network,
                ..IsolationOptions::default()
            },
            ..ShellOptions::default()
        })
    };
    let allowlist = Allowlist {
        allow: vec![format!("bench.test:{port}")],
        resolve: [("bench.test".to_owned(), "127.0.0.1".parse()?)].into(),
        max_bytes: 1 << 40,
        ..Allowlist::default()
    };
    let proxied = tool(NetworkPolicy::Allowlist(allowlist))?;
    if let Some(why) = proxied.refusal() {
        println!("network_by_name: unavailable ({why})");
        return Ok(());
    }
    let off = tool(NetworkPolicy::Off)?;
    let open = tool(NetworkPolicy::Open)?;
    let true_req = req("shell", json!({"argv": ["/bin/true"]}));
    let (with, without) = compare(
        rounds,
        20,
        || assert!(proxied.execute(&true_req).is_success()),
        || assert!(off.execute(&true_req).is_success()),
    );
    println!("network_spawn_us: {:.1}", with.as_secs_f64() * 1e6);
    println!("network_off_spawn_us: {:.1}", without.as_secs_f64() * 1e6);
    println!(
        "network_spawn_extra_ms: {:.3}",
        (with.as_secs_f64() - without.as_secs_f64()) * 1e3
    );
    let download = |tool: &ShellTool, host: &str| {
        let url = format!("http://{host}:{port}/big");
        let r = tool.execute(&req(
            "shell",
            json!({"argv": ["curl", "-sS", "-f", "-o", "/dev/null", url]}),
        ));
        assert!(r.is_success(), "{r:?}");
    };
    let (through, direct) = compare(
        5,
        1,
        || download(&proxied, "bench.test"),
        || download(&open, "127.0.0.1"),
    );
    println!(
        "proxy_mib_per_s: {:.0}",
        SIZE as f64 / (1 << 20) as f64 / through.as_secs_f64()
    );
    println!(
        "direct_mib_per_s: {:.0}",
        SIZE as f64 / (1 << 20) as f64 / direct.as_secs_f64()
    );
    println!(
        "proxy_throughput_ratio: {:.3}",
        direct.as_secs_f64() / through.as_secs_f64()
    );
    https_through_proxy(&dir_of_bench(), rounds)
}

fn dir_of_bench() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("correx-bench-https-{}", std::process::id()))
}

/// Small HTTPS fetches through a CONNECT tunnel against the same fetches made directly: a
/// fetch is a TLS handshake and a request, several flights each way, so a proxy that holds a
/// flight back (a corked socket) shows here, where a bulk download hides it.
fn https_through_proxy(
    dir: &std::path::Path,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=bench.test"])
        .args(["-addext", "subjectAltName=DNS:bench.test", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status();
    if !matches!(made, Ok(s) if s.success()) {
        println!("proxy_https: unavailable (openssl could not make a certificate)");
        return Ok(());
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut server = std::process::Command::new("openssl")
        .args(["s_server", "-quiet", "-www", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let up = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let result = (|| -> Result<(), Box<dyn std::error::Error>> {
        if !up {
            println!("proxy_https: unavailable (openssl s_server did not listen)");
            return Ok(());
        }
        let tool = |network: NetworkPolicy| {
            ShellTool::new(ShellOptions {
                allowed_executables: vec!["curl".into()],
                working_roots: vec![dir.to_path_buf()],
                timeout: Duration::from_secs(60),
                isolation: IsolationOptions {
                    network,
                    ..IsolationOptions::default()
                },
                ..ShellOptions::default()
            })
        };
        let proxied = tool(NetworkPolicy::Allowlist(Allowlist {
            allow: vec![format!("bench.test:{port}")],
            resolve: [("bench.test".to_owned(), "127.0.0.1".parse()?)].into(),
            ..Allowlist::default()
        }))?;
        let open = tool(NetworkPolicy::Open)?;
        const FETCHES: usize = 10;
        let url = format!("https://bench.test:{port}/");
        let fetch = |tool: &ShellTool, direct: bool| {
            let mut argv = vec!["curl".to_owned(), "-sS".into(), "-f".into()];
            argv.extend(["--cacert".into(), cert.display().to_string()]);
            if direct {
                argv.extend(["--resolve".into(), format!("bench.test:{port}:127.0.0.1")]);
            }
            for _ in 0..FETCHES {
                argv.extend(["-o".into(), "/dev/null".into(), url.clone()]);
            }
            let r = tool.execute(&req("shell", json!({"argv": argv, "cwd": dir})));
            assert!(r.is_success(), "{r:?}");
        };
        let (through, direct) =
            compare(rounds, 1, || fetch(&proxied, false), || fetch(&open, true));
        let per = |d: Duration| d.as_secs_f64() * 1e3 / FETCHES as f64;
        println!("proxy_https_fetch_ms: {:.2}", per(through));
        println!("direct_https_fetch_ms: {:.2}", per(direct));
        println!("proxy_https_extra_ms: {:.2}", per(through) - per(direct));
        Ok(())
    })();
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(dir);
    result
}
