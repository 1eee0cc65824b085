use crate::util::{child_test, free_port, is_child, llama_install, LlamaInstall, TempDir};
use correx::{
    ContextPack, DefaultModelManager, EventStore, GenerationConfig, InferenceRequest,
    ManagerOptions, ModelDescriptor, ModelLoadError, ModelManager, ProviderHealth, RecordedEvent,
    ResidencyMode, SqliteEventStore, MODEL_STREAM,
};
use std::io::BufRead;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) type TestResult = Result<(), Box<dyn std::error::Error>>;

pub(crate) struct Setup {
    pub _tmp: TempDir,
    pub store: Arc<SqliteEventStore>,
    pub manager: DefaultModelManager,
    pub install: LlamaInstall,
    pub port: u16,
}

pub(crate) fn setup_with(
    install: LlamaInstall,
    tweak: impl FnOnce(&mut ManagerOptions),
) -> Result<Setup, Box<dyn std::error::Error>> {
    let tmp = TempDir::new("manager");
    let store = Arc::new(SqliteEventStore::open(tmp.join("events.db"))?);
    let port = free_port();
    let mut options = ManagerOptions {
        server_bin: install.server.clone(),
        port,
        log_dir: Some(tmp.join("logs")),
        ..ManagerOptions::default()
    };
    tweak(&mut options);
    let manager = DefaultModelManager::new(store.clone(), options)?;
    Ok(Setup {
        _tmp: tmp,
        store,
        manager,
        install,
        port,
    })
}

pub(crate) fn descriptor(
    install: &LlamaInstall,
    id: &str,
    residency: ResidencyMode,
) -> ModelDescriptor {
    let mut d = ModelDescriptor::new(id, &install.model, residency);
    d.context_size = 1024;
    d.threads = Some(2);
    d.extra_args = vec![
        "--no-jinja".into(),
        "--chat-template".into(),
        "gemma".into(),
    ];
    d
}

pub(crate) fn model_events(
    store: &SqliteEventStore,
) -> Result<Vec<RecordedEvent>, correx::EventStoreError> {
    // Read in pages: a store hands out at most a page per call.
    let mut out: Vec<RecordedEvent> = Vec::new();
    loop {
        let from = out.last().map_or(1, |e| e.stream_version + 1);
        let page = store.read_stream(MODEL_STREAM, from, 1000)?;
        if page.is_empty() {
            return Ok(out);
        }
        out.extend(page);
    }
}

pub(crate) fn kinds(events: &[RecordedEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e.type_id.as_str() {
            "model.unloaded" => format!("unloaded:{}", e.payload["reason"].as_str().unwrap_or("?")),
            "model.loaded" => format!("loaded:{}", e.payload["model_id"].as_str().unwrap_or("?")),
            other => other.to_owned(),
        })
        .collect()
}

pub(crate) fn alive(pid: u32) -> bool {
    // A zombie still has a /proc entry; look at its state.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.split_whitespace().nth(2).is_none_or(|st| st != "Z"))
        .unwrap_or(false)
}

pub(crate) fn ask(max_tokens: u32) -> InferenceRequest {
    InferenceRequest {
        context: ContextPack {
            task: Some("Tell me about the sea.".into()),
            ..ContextPack::default()
        },
        config: GenerationConfig {
            temperature: 0.0,
            max_tokens,
            seed: Some(3),
            ..GenerationConfig::default()
        },
        session: None,
    }
}

pub(crate) fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> TestResult {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("timed out waiting for {what}").into())
}

#[test]
fn load_is_idempotent_and_a_swap_restarts_the_server() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let a = descriptor(&s.install, "model-a", ResidencyMode::Persistent);
    let provider = s.manager.load(&a)?;
    let pid_a = s.manager.server_pid().ok_or("no pid")?;
    assert_eq!(
        s.manager.current_model().map(|d| d.model_id),
        Some("model-a".into())
    );
    assert_eq!(s.manager.health_check(), ProviderHealth::Healthy);
    assert!(provider.infer(&ask(4))?.usage.completion_tokens > 0);
    s.manager.load(&a)?;
    assert_eq!(
        s.manager.server_pid(),
        Some(pid_a),
        "same id must not restart"
    );
    let b = descriptor(&s.install, "model-b", ResidencyMode::Persistent);
    s.manager.load(&b)?;
    let pid_b = s.manager.server_pid().ok_or("no pid")?;
    assert_ne!(pid_a, pid_b);
    assert!(!alive(pid_a), "the replaced server still runs");
    let events = model_events(&s.store)?;
    assert_eq!(
        kinds(&events),
        [
            "loaded:model-a",
            "inference.completed",
            "unloaded:evicted",
            "loaded:model-b"
        ]
    );
    assert_eq!(events[0].payload["pid"], pid_a);
    // The unload names the server it stopped.
    assert_eq!(events[2].payload["pid"], pid_a);
    assert_eq!(events[2].payload["port"], s.port);
    s.manager.unload("model-b")?;
    assert!(!alive(pid_b));
    assert_eq!(s.manager.current_model(), None);
    assert_eq!(
        kinds(&model_events(&s.store)?).last().map(String::as_str),
        Some("unloaded:requested")
    );
    assert!(matches!(
        s.manager.health_check(),
        ProviderHealth::Unhealthy { .. }
    ));
    Ok(())
}

#[test]
fn a_health_timeout_is_an_error_with_no_event_and_no_process() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |o| o.health_timeout = Duration::from_millis(1))?;
    let d = descriptor(&s.install, "slow", ResidencyMode::Persistent);
    match s.manager.load(&d).err() {
        Some(ModelLoadError::Timeout { .. }) => {}
        other => return Err(format!("expected a timeout, got {other:?}").into()),
    }
    assert!(model_events(&s.store)?.is_empty());
    assert_eq!(s.manager.server_pid(), None);
    assert!(
        std::net::TcpListener::bind(("127.0.0.1", s.port)).is_ok(),
        "something still holds the port"
    );
    Ok(())
}

#[test]
fn load_failures_are_typed_and_record_nothing() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let tmp = TempDir::new("badmodel");
    let s = setup_with(install, |_| {})?;
    let mut d = descriptor(&s.install, "m", ResidencyMode::Persistent);
    d.model_path = tmp.join("missing.gguf");
    assert!(matches!(
        s.manager.load(&d).err(),
        Some(ModelLoadError::ModelFileMissing { .. })
    ));
    std::fs::write(tmp.join("garbage.gguf"), b"this is not a gguf file at all")?;
    d.model_path = tmp.join("garbage.gguf");
    match s.manager.load(&d).err() {
        Some(e @ ModelLoadError::ExitedWhileLoading { .. }) => {
            let ModelLoadError::ExitedWhileLoading { log_tail, .. } = &e else {
                unreachable!()
            };
            assert!(
                !log_tail.is_empty(),
                "the error should carry the server's log"
            );
            assert!(e.to_string().contains("last log lines"));
        }
        other => return Err(format!("expected an exit while loading, got {other:?}").into()),
    }
    // The log file exists and holds the server's output.
    let log = std::fs::read_to_string(s.manager.log_path())?;
    assert!(!log.is_empty());
    let missing_bin = setup_with(s.install.clone(), |o| {
        o.server_bin = "/nonexistent/llama-server".into()
    })?;
    let d = descriptor(&s.install, "m", ResidencyMode::Persistent);
    assert!(matches!(
        missing_bin.manager.load(&d).err(),
        Some(ModelLoadError::BinaryNotFound { .. })
    ));
    assert!(model_events(&s.store)?.is_empty());
    Ok(())
}

#[test]
fn a_port_held_by_another_listener_is_a_clear_error_with_no_event() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    // A range of one port: with more, the manager moves on to the next free one.
    let s = setup_with(install, |o| o.port_count = 1)?;
    let _squatter = std::net::TcpListener::bind(("127.0.0.1", s.port))?;
    let d = descriptor(&s.install, "m", ResidencyMode::Persistent);
    match s.manager.load(&d).err() {
        Some(e @ ModelLoadError::PortInUse { .. }) => {
            assert!(e.to_string().contains(&s.port.to_string()))
        }
        other => return Err(format!("expected PortInUse, got {other:?}").into()),
    }
    assert!(model_events(&s.store)?.is_empty());
    Ok(())
}

#[test]
fn a_killed_server_is_recorded_as_a_crash_and_reloads() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let d = descriptor(&s.install, "m", ResidencyMode::Persistent);
    s.manager.load(&d)?;
    let pid = s.manager.server_pid().ok_or("no pid")?;
    // SAFETY: SIGKILL to the server we just started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_for("the crash event", Duration::from_secs(10), || {
        model_events(&s.store)
            .map(|e| kinds(&e).contains(&"unloaded:crashed".to_owned()))
            .unwrap_or(false)
    })?;
    assert_eq!(s.manager.current_model(), None);
    assert!(matches!(
        s.manager.health_check(),
        ProviderHealth::Unhealthy { .. }
    ));
    let provider = s.manager.load(&d)?;
    assert!(provider.infer(&ask(3)).is_ok());
    assert_eq!(
        kinds(&model_events(&s.store)?)[..3],
        ["loaded:m", "unloaded:crashed", "loaded:m"]
    );
    Ok(())
}

#[test]
fn ephemeral_unloads_after_each_inference_and_reloads_on_the_next() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let d = descriptor(&s.install, "eph", ResidencyMode::Ephemeral);
    let provider = s.manager.load(&d)?;
    provider.infer(&ask(3))?;
    assert_eq!(s.manager.current_model(), None);
    provider.infer(&ask(3))?;
    assert_eq!(s.manager.current_model(), None);
    assert_eq!(
        kinds(&model_events(&s.store)?),
        [
            "loaded:eph",
            "inference.completed",
            "unloaded:ephemeral",
            "loaded:eph",
            "inference.completed",
            "unloaded:ephemeral"
        ]
    );
    Ok(())
}

#[test]
fn persistent_never_unloads_by_itself() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let mut d = descriptor(&s.install, "keep", ResidencyMode::Persistent);
    d.idle_timeout = Duration::from_millis(50);
    let provider = s.manager.load(&d)?;
    provider.infer(&ask(2))?;
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        s.manager.current_model().map(|d| d.model_id),
        Some("keep".into())
    );
    Ok(())
}

#[test]
fn dynamic_idle_timer_resets_on_each_inference() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let mut d = descriptor(&s.install, "dyn", ResidencyMode::Dynamic);
    d.idle_timeout = Duration::from_millis(1500);
    let provider = s.manager.load(&d)?;
    for _ in 0..3 {
        provider.infer(&ask(2))?;
        std::thread::sleep(Duration::from_millis(900));
        assert!(
            s.manager.current_model().is_some(),
            "unloaded before the idle timeout"
        );
    }
    wait_for("the idle unload", Duration::from_secs(5), || {
        s.manager.status().is_empty()
    })?;
    let k = kinds(&model_events(&s.store)?);
    assert_eq!(k.last().map(String::as_str), Some("unloaded:idle"));
    assert_eq!(k.iter().filter(|x| x.starts_with("unloaded")).count(), 1);
    Ok(())
}

#[test]
fn dynamic_idle_shorter_than_an_inference_never_kills_it() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let mut d = descriptor(&s.install, "dyn-short", ResidencyMode::Dynamic);
    d.idle_timeout = Duration::from_millis(30);
    let provider = s.manager.load(&d)?;
    // Arm the timer, then run an inference that takes far longer than the timeout.
    provider.infer(&ask(1))?;
    let started = Instant::now();
    let r = provider.infer(&ask(48))?;
    assert!(started.elapsed() > Duration::from_millis(100));
    assert!(r.usage.completion_tokens > 1);
    wait_for("the idle unload", Duration::from_secs(5), || {
        s.manager.status().is_empty()
    })?;
    Ok(())
}

/// Helper: a host that loads a model, prints the server's pid, then waits to be killed.
#[test]
#[ignore = "helper: run by a_host_killed_with_sigkill_leaves_no_server_behind"]
fn child_host_with_a_model() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let d = descriptor(&s.install, "orphan-check", ResidencyMode::Persistent);
    s.manager.load(&d)?;
    // The parent kills this process, so it removes this scratch directory itself.
    println!("SCRATCH={}", s._tmp.path().display());
    println!("SERVER_PID={}", s.manager.server_pid().ok_or("no pid")?);
    std::thread::sleep(Duration::from_secs(120));
    Ok(())
}

#[test]
fn a_host_killed_with_sigkill_leaves_no_server_behind() -> TestResult {
    if llama_install().is_none() {
        return Ok(());
    }
    let mut child = child_test("manager::child_host_with_a_model")
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut pid = None;
    let mut scratch = None;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(dir) = line.split("SCRATCH=").nth(1) {
            scratch = Some(std::path::PathBuf::from(dir.trim()));
        }
        if let Some(p) = line.split("SERVER_PID=").nth(1) {
            pid = Some(p.trim().parse::<u32>()?);
            break;
        }
    }
    let pid = pid.ok_or("the host never loaded the model")?;
    assert!(alive(pid));
    // SAFETY: SIGKILL to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait()?;
    if let Some(dir) = scratch {
        let _ = std::fs::remove_dir_all(dir);
    }
    wait_for("the orphaned server to die", Duration::from_secs(5), || {
        !alive(pid)
    })
}

#[test]
fn eight_threads_loading_inferring_and_unloading_keep_one_server_and_alternating_events(
) -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = Arc::new(setup_with(install, |_| {})?);
    let ids = ["eight-x", "eight-y"];
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Watch /proc for servers of this test's models (their alias starts with the id).
    let watcher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let n = crate::tools_util::count_processes(|cmd| {
                    cmd.contains("llama-server") && cmd.contains("--alias eight-")
                });
                most = most.max(n);
                std::thread::sleep(Duration::from_millis(5));
            }
            most
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let workers: Vec<_> = (0..8)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || -> Result<u32, String> {
                let mut ops = 0;
                let mut i = t;
                while Instant::now() < deadline {
                    let d = descriptor(&s.install, ids[i % 2], ResidencyMode::Persistent);
                    match i % 4 {
                        0 | 1 => {
                            let p = s.manager.provider(&d);
                            // A concurrent swap or unload waits for it: nothing kills it.
                            p.infer(&ask(2)).map_err(|e| e.to_string())?;
                        }
                        2 => {
                            s.manager.load(&d).map_err(|e| e.to_string())?;
                        }
                        _ => s.manager.unload(&d.model_id).map_err(|e| e.to_string())?,
                    }
                    ops += 1;
                    i += 3;
                }
                Ok(ops)
            })
        })
        .collect();
    let mut total = 0;
    for w in workers {
        total += w.join().map_err(|_| "worker panicked")??;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = watcher.join().map_err(|_| "watcher panicked")?;
    assert!(total > 8, "only {total} operations in 30 s");
    assert!(most <= 1, "{most} servers were alive at once");
    let lifecycle: Vec<String> = kinds(&model_events(&s.store)?)
        .into_iter()
        .filter(|k| k.starts_with("loaded") || k.starts_with("unloaded"))
        .collect();
    assert!(lifecycle.len() >= 2);
    for (i, k) in lifecycle.iter().enumerate() {
        assert_eq!(
            k.starts_with("loaded"),
            i % 2 == 0,
            "events do not alternate: {lifecycle:?}"
        );
    }
    Ok(())
}

/// llama-server gets none of the host's descriptors, even those opened without close-on-exec,
/// and none of its environment.
#[test]
fn the_server_inherits_no_host_descriptor_and_no_host_environment() -> TestResult {
    use std::os::unix::ffi::OsStrExt;
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let leaked = s._tmp.join("host-secret-fd");
    std::fs::write(&leaked, "secret")?;
    let path = std::ffi::CString::new(leaked.as_os_str().as_bytes())?;
    // SAFETY: opening a file we just wrote, deliberately without O_CLOEXEC, as a careless
    // host would; closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
    assert!(fd >= 0);
    std::env::set_var("CORREX_HOST_ONLY_VARIABLE", "hunter2");
    let loaded = s
        .manager
        .load(&descriptor(&s.install, "fds", ResidencyMode::Persistent));
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(fd) };
    loaded?;
    let pid = s.manager.server_pid().ok_or("no pid")?;
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))?
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|p| p.display().to_string())
        .collect();
    assert!(!fds.is_empty(), "no descriptors listed for the server");
    assert!(
        !fds.iter().any(|f| f.contains("host-secret-fd")),
        "the server inherited the host's descriptor: {fds:?}"
    );
    let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
    assert!(!String::from_utf8_lossy(&environ).contains("hunter2"));
    Ok(())
}

#[test]
fn a_managed_stream_records_its_answer_and_a_cancelled_one_still_applies_residency() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let d = descriptor(&s.install, "eph", ResidencyMode::Ephemeral);
    let provider = s.manager.load(&d)?;
    let mut streamed = String::new();
    let r = provider.infer_stream(&ask(6), &correx::CancelToken::new(), &mut |c| {
        streamed.push_str(c.text);
        correx::StreamControl::Continue
    })?;
    assert_eq!(
        (streamed.as_str(), r.model.as_str()),
        (r.text.as_str(), "eph")
    );
    // A cancel from another thread while the answer streams, on the calling thread's call.
    let token = correx::CancelToken::new();
    let canceller = token.clone();
    let mut pieces = 0;
    let cancelled = provider.infer_stream(&ask(2000), &token, &mut |_| {
        pieces += 1;
        if pieces == 3 {
            let c = canceller.clone();
            std::thread::spawn(move || c.cancel());
        }
        correx::StreamControl::Continue
    });
    assert!(
        matches!(cancelled, Err(correx::InferenceError::Cancelled)),
        "{cancelled:?}"
    );
    assert!(pieces < 200, "the generation stopped: {pieces} pieces");
    assert_eq!(
        s.manager.current_model(),
        None,
        "the cancelled inference ended its flight"
    );
    let events = model_events(&s.store)?;
    assert_eq!(
        kinds(&events),
        [
            "loaded:eph",
            "inference.completed",
            "unloaded:ephemeral",
            "loaded:eph",
            "unloaded:ephemeral"
        ],
        "a cancelled answer is not recorded as completed"
    );
    assert_eq!(events[1].payload["usage"], serde_json::to_value(r.usage)?);
    Ok(())
}

#[test]
fn the_same_id_with_another_server_reloads_and_a_residency_change_does_not() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let a = descriptor(&s.install, "m", ResidencyMode::Persistent);
    s.manager.load(&a)?;
    let first = s.manager.server_pid().ok_or("no pid")?;
    // Residency needs no new server: same process, the new residency applies.
    let mut calmer = a.clone();
    calmer.residency = ResidencyMode::Dynamic;
    calmer.idle_timeout = Duration::from_secs(600);
    s.manager.load(&calmer)?;
    assert_eq!(s.manager.server_pid(), Some(first));
    assert_eq!(
        s.manager.current_model().map(|d| d.residency),
        Some(ResidencyMode::Dynamic)
    );
    // A larger context is another server: restarted, recorded as replaced.
    let mut wider = calmer.clone();
    wider.context_size = 2048;
    s.manager.load(&wider)?;
    let second = s.manager.server_pid().ok_or("no pid")?;
    assert_ne!(first, second);
    assert!(!alive(first), "the old server still runs");
    assert_eq!(
        s.manager.current_model().map(|d| d.context_size),
        Some(2048)
    );
    // So are other server arguments.
    let mut other_args = wider.clone();
    other_args.extra_args.push("--no-warmup".into());
    s.manager.load(&other_args)?;
    assert_ne!(s.manager.server_pid(), Some(second));
    assert_eq!(
        kinds(&model_events(&s.store)?),
        [
            "loaded:m",
            "unloaded:replaced",
            "loaded:m",
            "unloaded:replaced",
            "loaded:m"
        ]
    );
    Ok(())
}

#[test]
fn a_dynamic_model_loaded_and_never_used_unloads_when_idle() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let mut d = descriptor(&s.install, "dyn", ResidencyMode::Dynamic);
    d.idle_timeout = Duration::from_millis(300);
    s.manager.load(&d)?;
    let pid = s.manager.server_pid().ok_or("no pid")?;
    wait_for("the idle unload", Duration::from_secs(20), || {
        s.manager.status().is_empty()
    })?;
    assert!(!alive(pid));
    assert_eq!(
        kinds(&model_events(&s.store)?),
        ["loaded:dyn", "unloaded:idle"]
    );
    Ok(())
}

#[test]
fn a_server_that_died_is_recorded_as_crashed_by_whichever_call_notices() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let d = descriptor(&s.install, "m", ResidencyMode::Persistent);
    s.manager.load(&d)?;
    let pid = s.manager.server_pid().ok_or("no pid")?;
    // SAFETY: kill(2) on the manager's own server.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_for("the server to die", Duration::from_secs(10), || !alive(pid))?;
    // Whether the exit watcher or this unload gets there first, the reason is the truth.
    s.manager.unload("m")?;
    let unloads: Vec<String> = kinds(&model_events(&s.store)?)
        .into_iter()
        .filter(|k| k.starts_with("unloaded"))
        .collect();
    assert_eq!(unloads, ["unloaded:crashed"]);
    Ok(())
}

#[test]
fn a_swap_waits_for_the_running_inference_to_finish() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    // Generous: on a busy 2-core machine a 40-token answer can take far longer than usual.
    let s = setup_with(install, |o| o.drain_timeout = Duration::from_secs(300))?;
    let a = descriptor(&s.install, "model-a", ResidencyMode::Persistent);
    let b = descriptor(&s.install, "model-b", ResidencyMode::Persistent);
    let provider = s.manager.load(&a)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let running = std::thread::spawn(move || {
        let mut first = Some(tx);
        provider.infer_stream(&ask(40), &correx::CancelToken::new(), &mut |_| {
            if let Some(tx) = first.take() {
                let _ = tx.send(());
            }
            correx::StreamControl::Continue
        })
    });
    rx.recv_timeout(Duration::from_secs(60))?;
    // The swap waits for the answer instead of killing its server.
    s.manager.load(&b)?;
    let answer = running
        .join()
        .map_err(|_| "the inference thread panicked")??;
    assert!(answer.usage.completion_tokens > 1, "{answer:?}");
    assert_eq!(
        kinds(&model_events(&s.store)?),
        [
            "loaded:model-a",
            "inference.completed",
            "unloaded:evicted",
            "loaded:model-b"
        ]
    );
    Ok(())
}

#[test]
fn a_swap_that_cannot_drain_in_time_is_busy_and_leaves_the_inference_running() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |o| o.drain_timeout = Duration::from_millis(300))?;
    let a = descriptor(&s.install, "model-a", ResidencyMode::Persistent);
    let b = descriptor(&s.install, "model-b", ResidencyMode::Persistent);
    let provider = s.manager.load(&a)?;
    let pid = s.manager.server_pid().ok_or("no pid")?;
    let token = correx::CancelToken::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let running = std::thread::spawn({
        let token = token.clone();
        move || {
            let mut first = Some(tx);
            provider.infer_stream(&ask(4000), &token, &mut |_| {
                if let Some(tx) = first.take() {
                    let _ = tx.send(());
                }
                correx::StreamControl::Continue
            })
        }
    });
    rx.recv_timeout(Duration::from_secs(60))?;
    match s.manager.load(&b) {
        Err(e @ ModelLoadError::Busy { in_flight: 1, .. }) => {
            assert!(e.to_string().contains("model-a"), "{e}")
        }
        Err(other) => return Err(format!("{other}").into()),
        Ok(_) => return Err("the swap did not wait".into()),
    }
    assert!(matches!(
        s.manager.unload("model-a"),
        Err(ModelLoadError::Busy { .. })
    ));
    assert_eq!(s.manager.server_pid(), Some(pid), "nothing changed");
    assert!(alive(pid));
    token.cancel();
    let cancelled = running
        .join()
        .map_err(|_| "the inference thread panicked")?;
    assert!(matches!(cancelled, Err(correx::InferenceError::Cancelled)));
    s.manager.unload("model-a")?;
    assert_eq!(
        kinds(&model_events(&s.store)?),
        ["loaded:model-a", "unloaded:requested"]
    );
    Ok(())
}

#[test]
fn status_and_health_answer_while_another_call_loads() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = setup_with(install, |_| {})?;
    let d = descriptor(&s.install, "m", ResidencyMode::Persistent);
    let log = s.manager.log_path();
    std::thread::scope(|scope| -> TestResult {
        let (tx, rx) = std::sync::mpsc::channel();
        let (manager, d) = (&s.manager, &d);
        let loading = scope.spawn(move || {
            let r = manager.load(d).map(|_| ());
            let _ = tx.send(());
            r
        });
        // The server has started (it writes its log) and is still loading its model.
        wait_for("the server to start", Duration::from_secs(30), || {
            std::fs::metadata(&log).is_ok_and(|m| m.len() > 0)
        })?;
        let status = s.manager.current_model();
        let health = s.manager.health_check();
        let listed = s.manager.status();
        // The server is still not ready, so neither call waited for the load.
        let ready =
            crate::util::raw_http(s.port, "GET", "/health", "").is_ok_and(|(c, _)| c == 200);
        assert!(
            !ready && rx.try_recv().is_err(),
            "status and health waited for the load to finish"
        );
        assert_eq!(status, None);
        assert!(matches!(health, ProviderHealth::Unhealthy { .. }));
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].model_id.as_str(), listed[0].state),
            ("m", correx::ModelState::Loading)
        );
        loading.join().map_err(|_| "the load panicked")??;
        assert_eq!(
            s.manager.current_model().map(|m| m.model_id),
            Some("m".into())
        );
        let listed = s.manager.status();
        assert_eq!(listed.len(), 1);
        let m = &listed[0];
        assert_eq!(m.state, correx::ModelState::Loaded);
        assert_eq!(
            (m.pid, m.port, m.in_flight),
            (s.manager.server_pid(), Some(s.port), 0)
        );
        assert!(m.rss_bytes.is_some_and(|b| b > 10 << 20), "{m:?}");
        assert!(m.loaded_at_ms.is_some() && m.idle_expires_in_ms.is_none());
        Ok(())
    })
}
