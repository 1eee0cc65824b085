//! llama-server confined like the shell (`models.isolation`): attacked through its own static
//! file server (`--path /`) and its slot-save API, its capabilities and its view read from
//! /proc, as root and again as nobody.

use crate::manager::{descriptor, model_events, setup_with, TestResult};
use crate::util::{child_test, is_child, llama_install, raw_http, LlamaInstall, TempDir};
use correx::{ModelManager, ResidencyMode, ServerIsolation};
use std::path::PathBuf;

const NOBODY: u32 = 65534;

/// The capability and confinement lines of `/proc/PID/status`.
fn status_of(pid: u32) -> Result<std::collections::BTreeMap<String, String>, std::io::Error> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| k.starts_with("Cap") || *k == "NoNewPrivs" || *k == "Seccomp")
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect())
}

/// Serves `/` with the server's own static file feature and asks it for `/etc/shadow` and a
/// file planted outside the model's directory: confined, neither comes back; with isolation
/// `none`, the planted file does (so the test can tell).
fn scenario(install: LlamaInstall) -> TestResult {
    let plant = TempDir::new("server-plant");
    let secret = plant.join("planted.txt");
    std::fs::write(&secret, "PLANTED-SECRET")?;
    let secret_url = secret.display().to_string();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;

    // With a prompt cache: another model's saves and every session's record sit beside the
    // one directory the server may write.
    let cache = plant.join("prompt-cache");
    let other = cache.join("0123456789abcdef0123456789abcdef");
    let with_cache = |o: &mut correx::ManagerOptions| {
        o.prompt_cache = Some(correx::PromptCacheOptions {
            dir: Some(cache.clone()),
            ..correx::PromptCacheOptions::default()
        })
    };
    let s = setup_with(install.clone(), with_cache)?;
    std::fs::create_dir_all(&other)?;
    std::fs::write(other.join("victim.bin"), "ANOTHER-MODELS-CACHE")?;
    let mut d = descriptor(&s.install, "confined", ResidencyMode::Persistent);
    d.extra_args.extend(["--path".into(), "/".into()]);
    s.manager.load(&d)?;
    let status = s.manager.status();
    let m = status.first().ok_or("nothing loaded")?;
    let (pid, port) = (m.pid.ok_or("no pid")?, m.port.ok_or("no port")?);
    let (code, body) = raw_http(port, "GET", &secret_url, "")?;
    assert!(
        !body.contains("PLANTED-SECRET"),
        "the planted file was served ({code})"
    );
    let (code, body) = raw_http(port, "GET", "/etc/shadow", "")?;
    assert!(!body.contains("root:"), "/etc/shadow was served ({code})");
    let st = status_of(pid)?;
    for k in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(st[k], "0000000000000000", "{k}: {st:?}");
    }
    if root {
        assert_eq!(st["CapBnd"], "0000000000000000", "{st:?}");
    }
    assert_eq!(st["NoNewPrivs"], "1");
    assert_eq!(st["Seccomp"], "2");
    // It still serves the model.
    let r = s.manager.provider(&d).infer(&crate::manager::ask(4))?;
    assert!(r.usage.completion_tokens > 0);
    let events = model_events(&s.store)?;
    let loaded = events
        .iter()
        .find(|e| e.type_id == "model.loaded")
        .ok_or("no model.loaded")?;
    let iso = &loaded.payload["isolation"];
    assert_eq!(iso["mode"], "required", "{iso}");
    assert_eq!(iso["network"]["tcp_bind"][0], port);
    assert_eq!(iso["network"]["landlock_tcp"], true);
    // Its view holds its binary, libraries and model, each at its own path, and nothing of
    // the host's beside them: not the planted file, not the rest of /etc.
    assert_eq!(iso["view"]["built"], "server", "{iso}");
    let inside = |p: &std::path::Path| {
        std::fs::symlink_metadata(format!("/proc/{pid}/root{}", p.display())).is_ok()
    };
    assert!(
        inside(&d.model_path),
        "the model is not in the server's view"
    );
    assert!(!inside(&secret), "the planted file is in the server's view");
    // It writes its own key's directory and nothing else of the cache.
    let own = iso["filesystem"]["read_write"]
        .as_array()
        .filter(|w| w.len() == 1)
        .and_then(|w| w[0].as_str())
        .map(PathBuf::from)
        .ok_or_else(|| format!("not one writable path: {iso}"))?;
    assert_eq!(own.parent(), std::fs::canonicalize(&cache).ok().as_deref());
    assert!(inside(&own), "its cache directory is not in its view");
    for absent in [other.clone(), cache.join("sessions"), cache.join("digests")] {
        assert!(
            !inside(&absent),
            "{} is in the server's view",
            absent.display()
        );
    }
    let traversal =
        serde_json::json!({"filename": "../0123456789abcdef0123456789abcdef/victim.bin"});
    let (code, body) = raw_http(
        port,
        "POST",
        "/slots/0?action=restore",
        &traversal.to_string(),
    )?;
    assert!(
        code >= 400 && !body.contains("n_restored"),
        "a restore from another model's directory: {code} {body}"
    );
    for absent in ["/etc/shadow", "/etc/passwd", "/home", "/var"] {
        assert!(
            !inside(std::path::Path::new(absent)),
            "{absent} is in the server's view"
        );
    }
    s.manager.unload("confined")?;

    // The control: unconfined, the same request gets the planted file.
    let open = setup_with(install, |o| {
        with_cache(o);
        o.isolation = ServerIsolation::None;
    })?;
    let mut d = descriptor(&open.install, "open", ResidencyMode::Persistent);
    d.extra_args.extend(["--path".into(), "/".into()]);
    open.manager.load(&d)?;
    let (pid, port) = {
        let st = &open.manager.status()[0];
        (st.pid.ok_or("no pid")?, st.port.ok_or("no port")?)
    };
    assert!(
        std::fs::symlink_metadata(format!("/proc/{pid}/root{}", other.display())).is_ok(),
        "the unconfined server does not see another model's cache: the test cannot tell"
    );
    let (_, body) = raw_http(port, "GET", &secret_url, "")?;
    assert!(
        body.contains("PLANTED-SECRET"),
        "the unconfined server did not serve the planted file: the test cannot tell"
    );
    open.manager.unload("open")?;
    Ok(())
}

#[test]
fn llama_server_is_confined_as_root_and_as_nobody() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    scenario(install.clone())?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    // Nobody cannot reach root's cache: give it hard links of the binary and the model (same
    // filesystem, or copies) in a directory it can read.
    let dir = TempDir::new("server-nobody");
    let link = |from: &PathBuf, name: &str| -> Result<PathBuf, std::io::Error> {
        let to = dir.join(name);
        if std::fs::hard_link(from, &to).is_err() {
            std::fs::copy(from, &to)?;
        }
        Ok(to)
    };
    let server = link(&install.server, "llama-server")?;
    let model = link(&install.model, "model.gguf")?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    crate::util::assert_child_passes(
        child_test("server_confined::unprivileged_child")
            .env("CORREX_CHILD_SERVER", &server)
            .env("CORREX_CHILD_MODEL", &model),
        "scenario passed",
        &format!("as uid {NOBODY}"),
    )?;
    Ok(())
}

#[test]
#[ignore = "helper: run by llama_server_is_confined_as_root_and_as_nobody"]
fn unprivileged_child() {
    if !is_child() {
        return;
    }
    let install = LlamaInstall {
        server: std::env::var_os("CORREX_CHILD_SERVER")
            .expect("server")
            .into(),
        model: std::env::var_os("CORREX_CHILD_MODEL")
            .expect("model")
            .into(),
    };
    crate::util::become_nobody();
    scenario(install).expect("the scenario");
    println!("scenario passed");
}
