//! `correx doctor`: each requirement on one line, ok or missing, with what to do.

use crate::args::Args;
use crate::style::line;
use crate::Failure;
use correx::{
    kernel_features, CancelToken, ContextPack, DefaultModelManager, GenerationConfig,
    InferenceRequest, IsolationMode, LlamaInstall, ManagerOptions, ModelDescriptor, ModelManager,
    ResidencyMode, RuntimeConfig, ShellTool, SqliteEventStore,
};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How much a finding matters.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Ok,
    /// Works, with less than the best.
    Warn,
    /// correx cannot do its job here.
    Missing,
}

#[derive(Default)]
struct Report {
    missing: usize,
}

impl Report {
    fn say(&mut self, level: Level, what: &str, detail: &str) {
        let tag = match level {
            Level::Ok => "ok     ",
            Level::Warn => "warn   ",
            Level::Missing => {
                self.missing += 1;
                "missing"
            }
        };
        line(&format!("{tag}  {what:<22} {detail}"));
    }
}

pub fn doctor(args: Args) -> Result<(), Failure> {
    args.positionals(&[])?;
    let config = match args.value("--config") {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::Run(format!("cannot read the config {path}: {e}")))?;
            Some(
                RuntimeConfig::from_json(&text)
                    .map_err(|e| Failure::Run(format!("config {path}: {e}")))?,
            )
        }
        None => None,
    };
    let mut r = Report::default();
    kernel(&mut r, config.as_ref());
    view(&mut r);
    llama(&mut r, config.as_ref(), !args.switch(&["--no-serve"]));
    sandbox_root(&mut r, config.as_ref());
    r.say(
        Level::Ok,
        "SQLite",
        &format!("{} (bundled)", rusqlite::version()),
    );
    if let Some(c) = &config {
        effects(c);
    }
    if r.missing > 0 {
        eprintln!(
            "correx: {} requirement(s) missing; correx cannot fully run here",
            r.missing
        );
        return Err(Failure::Found);
    }
    Ok(())
}

fn kernel(r: &mut Report, config: Option<&RuntimeConfig>) {
    let k = kernel_features();
    r.say(Level::Ok, "kernel", &k.release);
    let warn = |ok: bool| if ok { Level::Ok } else { Level::Warn };
    r.say(
        warn(k.openat2),
        "openat2",
        if k.openat2 {
            "file tools resolve paths in the kernel (RESOLVE_BENEATH)"
        } else {
            "absent (Linux < 5.6 or filtered): file tools walk paths with O_NOFOLLOW instead"
        },
    );
    r.say(
        warn(k.pidfd),
        "pidfd",
        if k.pidfd {
            "server exits are seen at once"
        } else {
            "absent (Linux < 5.3): server exits are polled every 100 ms"
        },
    );
    r.say(
        warn(k.close_range),
        "close_range",
        if k.close_range {
            "no host descriptor reaches a child"
        } else {
            "absent (Linux < 5.11): descriptors the host opened without O_CLOEXEC reach children"
        },
    );
    let required = config.is_some_and(|c| {
        c.tools.is_enabled("shell")
            && c.tools
                .get::<ShellTool>()
                .is_some_and(|o| o.isolation.mode == IsolationMode::Required)
    });
    let landlock = match (k.landlock_abi, required) {
        (abi, _) if abi >= 3 => (Level::Ok, format!("ABI {abi}: the shell is confined")),
        (abi, true) => (
            Level::Missing,
            format!(
                "ABI {abi}, the shell's isolation is \"required\" (needs 3): enable Landlock (lsm= boot list, Linux >= 6.2) or set tools.shell.isolation.mode to \"best_effort\""
            ),
        ),
        (abi, false) => (
            Level::Warn,
            format!("ABI {abi}: a shell with isolation \"required\" refuses to run; \"best_effort\" runs less confined"),
        ),
    };
    r.say(landlock.0, "Landlock", &landlock.1);
    r.say(
        warn(k.seccomp_filter),
        "seccomp",
        if k.seccomp_filter {
            "the shell's network can be taken away"
        } else {
            "no filter for this architecture: network denial needs Landlock ABI 4"
        },
    );
    r.say(Level::Ok, "containment", k.containment);
    // A run with a network allowlist gets a network namespace of its own (only its proxy in
    // it): root makes one, anyone else inside the run's user namespace. Elsewhere correx makes
    // the run's connects, held by its seccomp filter.
    let netns = current_uid() == 0 || k.containment == "user_and_pid_namespace";
    r.say(
        warn(netns || k.seccomp_user_notification),
        "network by name",
        if netns {
            "available: a run with an allowlist reaches its hosts through a proxy, alone in a network namespace"
        } else if k.seccomp_user_notification {
            "available: a run with an allowlist reaches its hosts through a proxy; its seccomp filter holds every connect and correx makes it (no network namespace without root or user namespaces)"
        } else {
            "unavailable (no network namespace without root or user namespaces, and no seccomp user notification with NOTIF_ADDFD, Linux 5.9, with Landlock): a run with an allowlist is refused (\"required\") or gets no network"
        },
    );
}

/// Which filesystem a confined run sees here: a view built for it (once per tool on a root
/// host, per run in a user namespace of its own elsewhere), with a /proc of its own or none,
/// or the host's tree filtered by Landlock; as a shell built now records it.
fn view(r: &mut Report) {
    let probe = ShellTool::new(correx::ShellOptions {
        allowed_executables: vec!["true".into()],
        isolation: correx::IsolationOptions {
            mode: IsolationMode::BestEffort,
            ..correx::IsolationOptions::default()
        },
        ..correx::ShellOptions::default()
    });
    let policy = match probe {
        Ok(t) => t.applied_policy().to_json(),
        Err(e) => {
            r.say(
                Level::Warn,
                "filesystem view",
                &format!("could not build a shell to look: {e}"),
            );
            return;
        }
    };
    let v = &policy["view"];
    let proc = if v["proc"] == "own" {
        "a /proc of its own (its processes only)"
    } else {
        "no /proc"
    };
    let why = v["fallback"].as_str().unwrap_or("");
    match v["built"].as_str() {
        Some("tool") => r.say(
            Level::Ok,
            "filesystem view",
            &format!("built once per tool: a run sees only what it is granted, each at its own path, with {proc}{}; spawned model servers get one too", if why.is_empty() { String::new() } else { format!(" ({why})") }),
        ),
        Some("run") => r.say(
            Level::Ok,
            "filesystem view",
            &format!("built for each run in its user namespace: a run sees only what it is granted, each at its own path, with {proc}{}; spawned model servers get one too", if why.is_empty() { String::new() } else { format!(" ({why})") }),
        ),
        _ => r.say(
            Level::Warn,
            "filesystem view",
            &format!("none: runs walk the host's tree, filtered by Landlock ({why})"),
        ),
    }
}

/// Checks llama-server and the model; with `serve`, loads the model and asks it one token.
fn llama(r: &mut Report, config: Option<&RuntimeConfig>, serve: bool) {
    let install = LlamaInstall::locate();
    // Unless the config names one, server_bin is the installed one, else a bare name.
    // (ManagerOptions' default, from the install already located above.)
    let default_bin = install
        .as_ref()
        .map_or_else(|| PathBuf::from("llama-server"), |i| i.server.clone());
    let configured = config
        .map(|c| c.models.server_bin.clone())
        .filter(|p| *p != default_bin);
    let server = configured
        .clone()
        .or_else(|| install.as_ref().map(|i| i.server.clone()));
    let server = match server {
        Some(s) if s.is_file() => {
            r.say(Level::Ok, "llama-server", &s.display().to_string());
            s
        }
        Some(s) => {
            r.say(
                Level::Missing,
                "llama-server",
                &format!(
                    "{} does not exist: run scripts/install-llama.sh, or fix models.server_bin",
                    s.display()
                ),
            );
            return;
        }
        None => {
            r.say(
                Level::Missing,
                "llama-server",
                "not installed: run scripts/install-llama.sh (or set CORREX_LLAMA_SERVER)",
            );
            return;
        }
    };
    let Some(model) = install.map(|i| i.model) else {
        r.say(
            Level::Missing,
            "model",
            "the default model is not installed: run scripts/install-llama.sh",
        );
        return;
    };
    model_sum(r, &model);
    if serve {
        match serve_once(&server, &model) {
            Ok(detail) => r.say(Level::Ok, "serving", &detail),
            Err(e) => r.say(
                Level::Missing,
                "serving",
                &format!("the server did not answer: {e}; rerun scripts/install-llama.sh (it rebuilds a build that cannot serve here)"),
            ),
        }
    }
}

fn model_sum(r: &mut Report, model: &Path) {
    let size = std::fs::metadata(model).map(|m| m.len()).unwrap_or(0);
    let sum = std::process::Command::new("sha256sum")
        .arg(model)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.split_whitespace().next().map(str::to_owned));
    match sum {
        Some(s) if s == LlamaInstall::MODEL_SHA256 && size == LlamaInstall::MODEL_BYTES => r.say(
            Level::Ok,
            "model",
            &format!("{} (sha256 {s})", model.display()),
        ),
        Some(s) => r.say(
            Level::Missing,
            "model",
            &format!(
                "{} has sha256 {s}, not {}: it is damaged; delete it and run scripts/install-llama.sh",
                model.display(),
                LlamaInstall::MODEL_SHA256
            ),
        ),
        None => r.say(
            Level::Warn,
            "model",
            &format!("{} ({size} bytes; no sha256sum to check it)", model.display()),
        ),
    }
}

/// Loads the model on a free port with a throwaway log, asks for one token, unloads.
fn serve_once(server: &Path, model: &Path) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("correx-doctor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let result = (|| {
        let store =
            Arc::new(SqliteEventStore::open(dir.join("events.db")).map_err(|e| e.to_string())?);
        let manager = DefaultModelManager::new(
            store,
            ManagerOptions {
                server_bin: server.to_path_buf(),
                port: 0,
                log_dir: Some(dir.clone()),
                ..ManagerOptions::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let mut d = ModelDescriptor::new("doctor", model, ResidencyMode::Persistent);
        d.context_size = 512;
        d.extra_args = vec![
            "--no-jinja".into(),
            "--chat-template".into(),
            "gemma".into(),
        ];
        let t = std::time::Instant::now();
        let provider = manager
            .load_with_cancel(&d, &CancelToken::new())
            .map_err(|e| e.to_string())?;
        let load_ms = t.elapsed().as_millis();
        let answer = provider
            .infer(&InferenceRequest {
                context: ContextPack {
                    task: Some("Say hi.".into()),
                    ..ContextPack::default()
                },
                config: GenerationConfig {
                    max_tokens: 1,
                    ..GenerationConfig::default()
                },
                session: None,
            })
            .map_err(|e| e.to_string())?;
        manager.unload("doctor").map_err(|e| e.to_string())?;
        Ok(format!(
            "loaded in {load_ms} ms, answered {} token(s) in {} ms",
            answer.usage.completion_tokens, answer.latency_ms
        ))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn sandbox_root(r: &mut Report, config: Option<&RuntimeConfig>) {
    let root = config
        .and_then(|c| c.sandbox_root.clone())
        .unwrap_or_else(correx::default_work_root);
    let shown = root.display().to_string();
    match std::fs::symlink_metadata(&root) {
        Err(_) => r.say(Level::Ok, "sandbox root", &format!("{shown} (created private on first use)")),
        Ok(m) if m.file_type().is_symlink() => r.say(
            Level::Missing,
            "sandbox root",
            &format!("{shown} is a symlink: remove it, or set sandbox_root to a private directory"),
        ),
        Ok(m) if !m.is_dir() => r.say(
            Level::Missing,
            "sandbox root",
            &format!("{shown} is not a directory: remove it or set sandbox_root"),
        ),
        Ok(m) if m.uid() != current_uid() || m.mode() & 0o077 != 0 => r.say(
            Level::Missing,
            "sandbox root",
            &format!(
                "{shown} is not private (owner {}, mode {:o}): chmod 700 it as its owner, or set sandbox_root",
                m.uid(),
                m.mode() & 0o777
            ),
        ),
        Ok(_) => r.say(Level::Ok, "sandbox root", &format!("{shown} (private)")),
    }
}

fn current_uid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
}

/// Every config field with what it does here.
fn effects(c: &RuntimeConfig) {
    storage_effects(c);
    approval_effects(c);
    for (field, effect) in c.tools.explain() {
        say_effect(&field, effect);
    }
    model_server_effects(&c.models);
    model_timing_effects(&c.models);
}

/// One config field's line.
fn say_effect(field: &str, effect: String) {
    line(&format!("config   {field:<28} {effect}"));
}

/// Where facts and runs are kept: the event log, its durability, the sandbox root.
fn storage_effects(c: &RuntimeConfig) {
    say_effect(
        "event_log",
        format!("{}: every fact is appended here", c.event_log.display()),
    );
    say_effect(
        "durability",
        format!(
            "{:?}: {}",
            c.durability,
            match c.durability {
                correx::Durability::Full => "each append is flushed to disk before it returns",
                correx::Durability::Normal =>
                    "flushed at checkpoints: a power loss may lose the last appends",
            }
        ),
    );
    say_effect(
        "sandbox_root",
        c.sandbox_root.as_ref().map_or_else(
            || format!("default: {}", correx::default_work_root().display()),
            |p| format!("{}: working directories and backups of runs", p.display()),
        ),
    );
}

/// Who approves tool runs: the engine and its rules.
fn approval_effects(c: &RuntimeConfig) {
    let a = &c.approvals;
    say_effect(
        "approvals.engine",
        match a.engine {
            correx::EngineChoice::Callback => {
                "callback: the host's approver decides T2 and T3 tools".to_owned()
            }
            correx::EngineChoice::Auto => format!("auto: tiers up to {} are approved", a.max_tier),
            correx::EngineChoice::Deny => "deny: every tool that needs approval is denied".into(),
            correx::EngineChoice::Durable => match a.deadline_secs {
                Some(d) => format!(
                    "durable: each request waits in the log for a decision from any process \
                     (`correx approvals decide`), expiring after {d} s"
                ),
                None => "durable: each request waits in the log for a decision from any \
                         process (`correx approvals decide`)"
                    .into(),
            },
        },
    );
    say_effect(
        "approvals.rules",
        format!("{} rule(s) checked before the engine", a.rules.len()),
    );
}

/// The model servers: their binary, ports, how many and how much, their confinement.
fn model_server_effects(m: &ManagerOptions) {
    say_effect("models.server_bin", m.server_bin.display().to_string());
    say_effect(
        "models.port",
        format!(
            "servers bind {}..{}",
            m.port,
            m.port.saturating_add(m.port_count.saturating_sub(1))
        ),
    );
    say_effect(
        "models.max_loaded",
        format!("at most {} spawned model(s) resident", m.max_loaded),
    );
    say_effect(
        "models.memory_budget_mb",
        m.memory_budget.map_or("no memory budget".into(), |b| {
            format!("resident servers kept under {} MiB", b >> 20)
        }),
    );
    say_effect(
        "models.isolation",
        match m.isolation {
            correx::ServerIsolation::Default => {
                "servers confined as \"required\" where the kernel offers every layer, else \"best_effort\"".into()
            }
            correx::ServerIsolation::Required => {
                "servers confined; a kernel without a layer fails the load".to_owned()
            }
            correx::ServerIsolation::BestEffort => {
                "servers confined as far as the kernel allows".to_owned()
            }
            correx::ServerIsolation::None => "servers fenced only, not confined".to_owned(),
        },
    );
}

/// The model servers' queue, waits and timeouts, and where their output goes.
fn model_timing_effects(m: &ManagerOptions) {
    say_effect(
        "models.max_queued",
        format!("{} load(s) may wait for room", m.max_queued),
    );
    say_effect(
        "models.drain_timeout_ms",
        format!(
            "swaps and unloads wait {} s for running inferences",
            m.drain_timeout.as_secs()
        ),
    );
    say_effect(
        "models.stop_grace_ms",
        format!(
            "a stopping server gets {} ms after SIGTERM before SIGKILL",
            m.stop_grace.as_millis()
        ),
    );
    say_effect(
        "models.liveness_interval_ms",
        format!(
            "servers are health-checked every {} ms",
            m.liveness_interval.as_millis()
        ),
    );
    say_effect(
        "models.health_timeout_ms",
        format!(
            "a load waits {} s for its server",
            m.health_timeout.as_secs()
        ),
    );
    say_effect(
        "models.read_timeout_ms",
        format!(
            "an answer may pause {} s between pieces",
            m.http.read_timeout.as_secs()
        ),
    );
    say_effect(
        "models.log_dir",
        m.log_dir.as_ref().map_or_else(
            || "default: $XDG_DATA_HOME/correx/logs".to_owned(),
            |p| format!("{}: every server's output", p.display()),
        ),
    );
}
