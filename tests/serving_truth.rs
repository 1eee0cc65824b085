//! The model manager's record stays true when servers die under it and when the log's disk
//! stalls: an unload names a crash as a crash whatever call stops the server, status answers
//! while an append waits, and a Busy error names what the call waited for. Real llama-server.

use crate::manager::{
    alive, ask, descriptor, kinds, model_events, setup_with, wait_for, TestResult,
};
use crate::util::{free_port, llama_install, pending_signals, BeforeAppend, HookedStore, TempDir};
use correx::{
    DefaultModelManager, EventStore, ManagerOptions, ModelLoadError, ModelManager, ModelState,
    NewEvent, RecordedEvent, ResidencyMode, SqliteEventStore,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

fn unloads(events: &[RecordedEvent]) -> Vec<String> {
    kinds(events)
        .into_iter()
        .filter(|k| k.starts_with("unloaded"))
        .collect()
}

fn sigkill(pid: u32) {
    // SAFETY: kill(2) on a server this test's manager started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// Killed by someone else, and at once stopped by correx for its own reason (an unload, an
/// eviction) before the death is visible: the record says crashed, not the stop's reason.
#[test]
fn a_server_killed_by_someone_else_is_a_crash_whatever_stops_it() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    // Long enough that correx's SIGTERM stays pending on a stopped server until this test
    // acts, however slow the machine.
    let s = Arc::new(setup_with(install, |o| {
        o.stop_grace = Duration::from_secs(600)
    })?);
    let m = descriptor(&s.install, "m", ResidencyMode::Persistent);
    let n = descriptor(&s.install, "n", ResidencyMode::Persistent);

    s.manager.load(&m)?;
    sigkill(s.manager.server_pid().ok_or("no pid")?);
    s.manager.unload("m")?;
    assert_eq!(unloads(&model_events(&s.store)?), ["unloaded:crashed"]);

    // max_loaded is 1: loading n evicts m, which someone killed just before.
    s.manager.load(&m)?;
    let pid = s.manager.server_pid().ok_or("no pid")?;
    sigkill(pid);
    s.manager.load(&n)?;
    assert_eq!(
        unloads(&model_events(&s.store)?),
        ["unloaded:crashed", "unloaded:crashed"]
    );
    assert!(!alive(pid));

    // Killed while correx's own stop waits for it: a stopped server holds correx's SIGTERM
    // pending; someone else's SIGKILL ends it first. Its exit was not visible when the stop
    // began, but the signal it died of was not correx's.
    s.manager.unload("n")?;
    s.manager.load(&m)?;
    let pid = s.manager.server_pid().ok_or("no pid")?;
    // SAFETY: SIGSTOP to the server this test's manager started.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    // Stopped before correx's SIGTERM comes: a SIGTERM sent while the SIGSTOP is still pending
    // is taken first (lower number) and handled, and the server stops halfway through its
    // shutdown with nothing pending.
    wait_for("the server to stop", Duration::from_secs(120), || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('T')))
    })?;
    let unload = std::thread::spawn({
        let s = s.clone();
        move || s.manager.unload("m")
    });
    wait_for(
        "correx's SIGTERM to be pending",
        Duration::from_secs(120),
        || pending_signals(pid) & (1 << (libc::SIGTERM - 1)) != 0,
    )?;
    sigkill(pid);
    unload.join().map_err(|_| "the unload panicked")??;
    assert_eq!(
        unloads(&model_events(&s.store)?),
        [
            "unloaded:crashed",
            "unloaded:crashed",
            "unloaded:requested",
            "unloaded:crashed"
        ]
    );

    // A stop correx makes on its own is still recorded for what it is.
    s.manager.load(&n)?;
    s.manager.unload("n")?;
    assert_eq!(
        unloads(&model_events(&s.store)?),
        [
            "unloaded:crashed",
            "unloaded:crashed",
            "unloaded:requested",
            "unloaded:crashed",
            "unloaded:requested"
        ]
    );
    Ok(())
}

/// The pid of the llama-server this process started for `model_id` (its alias on the command
/// line names the id; other tests run servers of their own in this process meanwhile).
fn server_for(model_id: &str) -> Option<u32> {
    let alias = format!("{model_id}#correx-{}-", std::process::id());
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&alias))
        })
}

/// The room is held by a server that is still loading (stopped here, as a hung start would
/// be): the Busy error names the model asked for and the one it waited for.
#[test]
fn a_busy_load_names_what_it_waited_for() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let s = Arc::new(setup_with(install, |o| {
        o.drain_timeout = Duration::from_millis(300);
    })?);
    let a = descriptor(&s.install, "held-a", ResidencyMode::Persistent);
    let b = descriptor(&s.install, "held-b", ResidencyMode::Persistent);
    let loading = std::thread::spawn({
        let s = s.clone();
        move || s.manager.load(&a).map(|_| ())
    });
    let mut server = None;
    wait_for("held-a's server to start", Duration::from_secs(30), || {
        server = server_for("held-a");
        server.is_some()
    })?;
    let server = server.ok_or("no server")?;
    // SAFETY: SIGSTOP to the server this test's manager is starting.
    unsafe { libc::kill(server as i32, libc::SIGSTOP) };
    let busy = s.manager.load(&b);
    // SAFETY: as above, SIGCONT.
    unsafe { libc::kill(server as i32, libc::SIGCONT) };
    match busy {
        Err(
            ref e @ ModelLoadError::Busy {
                ref requested,
                ref holding,
                in_flight: 0,
                ..
            },
        ) => {
            assert_eq!(requested, "held-b");
            assert_eq!(holding, "held-a to finish loading");
            let text = e.to_string();
            assert!(
                text.contains("held-b") && text.contains("held-a to finish loading"),
                "{text}"
            );
        }
        Err(other) => return Err(format!("expected Busy, got {other}").into()),
        Ok(_) => return Err("expected Busy, and held-b loaded".into()),
    }
    loading.join().map_err(|_| "the load panicked")??;
    assert_eq!(
        s.manager.current_model().map(|d| d.model_id),
        Some("held-a".to_owned())
    );
    Ok(())
}

/// Appends wait while the gate is closed: a disk that stalls.
#[derive(Default)]
struct Gate {
    closed: Mutex<bool>,
    opened: Condvar,
    waiting: AtomicUsize,
}

impl Gate {
    fn set_closed(&self, closed: bool) {
        *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = closed;
        self.opened.notify_all();
    }
}

impl BeforeAppend for Gate {
    fn before_append(&self, _: &[NewEvent]) -> Result<(), correx::EventStoreError> {
        let mut closed = self.closed.lock().unwrap_or_else(|p| p.into_inner());
        if *closed {
            self.waiting.fetch_add(1, Ordering::SeqCst);
            while *closed {
                closed = self.opened.wait(closed).unwrap_or_else(|p| p.into_inner());
            }
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// `status()` on another thread, failing the test if it does not answer within `patience`
/// (a status blocked behind the append would never answer while the gate is closed).
fn status_answers(
    manager: &Arc<DefaultModelManager>,
    patience: Duration,
) -> Result<Vec<correx::ModelStatus>, Box<dyn std::error::Error>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let m = manager.clone();
    std::thread::spawn(move || {
        let _ = tx.send(m.status());
    });
    rx.recv_timeout(patience)
        .map_err(|_| "status() did not answer while an append was stalled".into())
}

/// Appends that stall (a completion, a load, an unload) hold up no status: it answers from
/// memory, and shows each model as it is.
#[test]
fn status_answers_while_the_log_stalls() -> TestResult {
    let Some(install) = llama_install() else {
        return Ok(());
    };
    let tmp = TempDir::new("truth-stall");
    let store = Arc::new(HookedStore {
        inner: Arc::new(SqliteEventStore::open(tmp.join("events.db"))?),
        hook: Gate::default(),
    });
    let manager = Arc::new(DefaultModelManager::new(
        store.clone(),
        ManagerOptions {
            server_bin: install.server.clone(),
            port: free_port(),
            max_loaded: 2,
            log_dir: Some(tmp.join("logs")),
            ..ManagerOptions::default()
        },
    )?);
    let m = descriptor(&install, "m", ResidencyMode::Persistent);
    let n = descriptor(&install, "n", ResidencyMode::Persistent);
    let provider = manager.load(&m)?;
    let patience = Duration::from_secs(30);
    let stalled = |count: usize| {
        wait_for("an append to stall", Duration::from_secs(120), || {
            store.hook.waiting.load(Ordering::SeqCst) == count
        })
    };

    // A completion stalls: the inference still counts as running.
    store.hook.set_closed(true);
    let infer = std::thread::spawn(move || provider.infer(&ask(3)).map(|_| ()));
    stalled(1)?;
    let rows = status_answers(&manager, patience)?;
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].state, rows[0].in_flight), (ModelState::Loaded, 1));

    // A load stalls: the model shows as loading.
    let load = std::thread::spawn({
        let manager = manager.clone();
        move || manager.load(&n).map(|_| ())
    });
    stalled(2)?;
    let rows = status_answers(&manager, patience)?;
    let n_row = rows
        .iter()
        .find(|r| r.model_id == "n")
        .ok_or("no row for n")?;
    assert_eq!(n_row.state, ModelState::Loading);

    store.hook.set_closed(false);
    infer.join().map_err(|_| "the inference panicked")??;
    load.join().map_err(|_| "the load panicked")??;

    // An unload stalls: the model shows as unloading, its server already gone.
    store.hook.set_closed(true);
    let pid = manager.server_pid_of("m").ok_or("no pid")?;
    let unload = std::thread::spawn({
        let manager = manager.clone();
        move || manager.unload("m")
    });
    stalled(1)?;
    let rows = status_answers(&manager, patience)?;
    let m_row = rows
        .iter()
        .find(|r| r.model_id == "m")
        .ok_or("no row for m")?;
    assert_eq!(m_row.state, ModelState::Unloading);
    assert!(
        !alive(pid),
        "the unload is recorded after the server is gone"
    );
    store.hook.set_closed(false);
    unload.join().map_err(|_| "the unload panicked")??;

    let events = store.read_stream(correx::MODEL_STREAM, 1, 100)?;
    let mut kinds = kinds(&events);
    // The completion and the load stalled together and were let go together: either may be
    // appended first.
    if let Some(middle) = kinds.get_mut(1..3) {
        middle.sort();
    }
    assert_eq!(
        kinds,
        [
            "loaded:m",
            "inference.completed",
            "loaded:n",
            "unloaded:requested"
        ]
    );
    Ok(())
}
