//! The `correx` command as a process: show, tail, verify, audit, trace, doctor and tool run.

use crate::util::TempDir;
use correx::{
    append_domain, DomainEvent, EventStore, ExpectedVersion, NewEvent, SqliteEventStore,
    UnloadReason,
};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn correx() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_correx"));
    c.env_remove("NO_COLOR");
    c
}

fn run(args: &[&str]) -> Result<(i32, String, String), Box<dyn std::error::Error>> {
    let out = correx().args(args).stdin(Stdio::null()).output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    ))
}

/// A log with a model's life, an inference, two tool runs (one rejected) and a raw event.
fn write_log(path: &std::path::Path) -> Result<SqliteEventStore, Box<dyn std::error::Error>> {
    let store = SqliteEventStore::open(path)?;
    let pause = || std::thread::sleep(Duration::from_millis(15));
    let ev = |e: DomainEvent, stream: &str| append_domain(&store, stream, &e).map(|_| ());
    ev(
        DomainEvent::ModelLoaded {
            model_id: "gemma".into(),
            model_path: "/m/gemma.gguf".into(),
            port: Some(10000),
            pid: Some(4242),
            load_ms: 900,
            endpoints: vec![],
            endpoint_features: Vec::new(),
            isolation: None,
        },
        "model-manager",
    )?;
    pause();
    ev(
        DomainEvent::ToolApprovalDecided {
            session_id: "s1".into(),
            invocation_id: "inv-1".into(),
            tool_name: "file_write".into(),
            tier: 2,
            decision: "approved".into(),
            decided_by: "host".into(),
            wait_ms: 40,
            reason: None,
            answers_request: false,
            identity: None,
        },
        "session-s1",
    )?;
    ev(
        DomainEvent::ToolExecutionStarted {
            session_id: "s1".into(),
            invocation_id: "inv-1".into(),
            tool_name: "file_write".into(),
            tier: 2,
            isolation: None,
        },
        "session-s1",
    )?;
    pause();
    ev(
        DomainEvent::ToolExecutionCompleted {
            session_id: "s1".into(),
            invocation_id: "inv-1".into(),
            tool_name: "file_write".into(),
            duration_ms: 15,
            network: None,
        },
        "session-s1",
    )?;
    pause();
    ev(
        DomainEvent::InferenceCompleted {
            model_id: "gemma".into(),
            usage: correx::TokenUsage {
                prompt_tokens: 5,
                completion_tokens: 2,
                total_tokens: 7,
            },
            latency_ms: 10,
            finish_reason: "stop".into(),
            endpoint: None,
        },
        "model-manager",
    )?;
    ev(
        DomainEvent::ToolExecutionRejected {
            session_id: "s1".into(),
            invocation_id: "inv-2".into(),
            tool_name: "shell".into(),
            tier: 2,
            reason: "denied by the approver".into(),
            kind: None,
        },
        "session-s1",
    )?;
    ev(
        DomainEvent::ToolExecutionStarted {
            session_id: "s2".into(),
            invocation_id: "inv-3".into(),
            tool_name: "shell".into(),
            tier: 2,
            isolation: None,
        },
        "session-s2",
    )?;
    store.append(
        "notes",
        ExpectedVersion::Any,
        &[NewEvent::new(
            "host.note",
            1,
            serde_json::json!({"text": "hello"}),
        )],
    )?;
    pause();
    ev(
        DomainEvent::ModelUnloaded {
            model_id: "gemma".into(),
            reason: UnloadReason::Crashed,
            pid: Some(4242),
            port: Some(10000),
        },
        "model-manager",
    )?;
    Ok(store)
}

fn json_lines(text: &str) -> Result<Vec<Value>, serde_json::Error> {
    text.lines().map(serde_json::from_str).collect()
}

#[test]
fn show_prints_json_lines_when_piped_and_filters() -> TestResult {
    let tmp = TempDir::new("cli-show");
    let db = tmp.join("events.db");
    write_log(&db)?;
    let db = db.to_string_lossy().into_owned();
    let (code, out, err) = run(&["log", "show", &db])?;
    assert_eq!(code, 0, "{err}");
    let all = json_lines(&out)?;
    assert_eq!(all.len(), 9);
    assert_eq!(all[0]["type_id"], "model.loaded");
    assert_eq!(all[0]["payload"]["pid"], 4242);
    assert!(all[0]["time"].as_str().is_some_and(|t| t.ends_with('Z')));
    let (_, out, _) = run(&[
        "log",
        "show",
        &db,
        "--json",
        "--type",
        "tool.execution_started",
    ])?;
    assert_eq!(json_lines(&out)?.len(), 2);
    let (_, out, _) = run(&["log", "show", &db, "--stream", "session-s1", "--limit", "2"])?;
    let some = json_lines(&out)?;
    assert_eq!(some.len(), 2);
    assert!(some.iter().all(|e| e["stream_id"] == "session-s1"));
    let (_, out, _) = run(&["log", "show", &db, "--after", "6"])?;
    assert_eq!(json_lines(&out)?.len(), 3);
    let (_, out, _) = run(&["log", "show", &db, "--since", "1h"])?;
    assert_eq!(json_lines(&out)?.len(), 9);
    let (_, out, _) = run(&["log", "show", &db, "--since", "2999-01-01T00:00:00Z"])?;
    assert!(out.is_empty());
    Ok(())
}

#[test]
fn bad_input_is_one_line_and_a_non_zero_exit() -> TestResult {
    let tmp = TempDir::new("cli-bad");
    let not_a_log = tmp.join("notes.txt");
    std::fs::write(&not_a_log, "hello, not a database\n")?;
    let other_db = tmp.join("other.db");
    rusqlite::Connection::open(&other_db)?.execute_batch("CREATE TABLE t (x)")?;
    let missing = tmp.join("missing.db");
    for (args, code, says) in [
        (
            vec!["log", "show", missing.to_str().unwrap_or_default()],
            1,
            "no such file",
        ),
        (
            vec!["log", "show", not_a_log.to_str().unwrap_or_default()],
            1,
            "not a correx event log",
        ),
        (
            vec!["log", "verify", other_db.to_str().unwrap_or_default()],
            1,
            "no events table",
        ),
        (
            vec!["log", "show", "x.db", "--bogus"],
            2,
            "unknown flag --bogus",
        ),
        (vec!["log", "show"], 2, "missing DB"),
        (vec!["log", "show", "x.db", "--limit", "ten"], 2, "--limit"),
        (
            vec!["log", "show", "x.db", "--since", "yesterday"],
            2,
            "--since",
        ),
        (vec!["frobnicate"], 2, "unknown command"),
        (
            vec!["doctor", "--config", "/nonexistent.json"],
            1,
            "cannot read the config",
        ),
    ] {
        let (got, out, err) = run(&args)?;
        assert_eq!(got, code, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?} printed {out}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // Nothing was created or changed by looking.
    assert!(!missing.exists());
    let conn = rusqlite::Connection::open(&other_db)?;
    let tables: i64 = conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
    assert_eq!(tables, 1);
    Ok(())
}

#[test]
fn tail_follows_appends_from_another_process_and_ends_with_its_pipe() -> TestResult {
    let tmp = TempDir::new("cli-tail");
    let db = tmp.join("events.db");
    let store = write_log(&db)?;
    let mut cmd = correx();
    cmd.args(["log", "tail", "-f", "-n", "2"])
        .arg(&db)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // As from a terminal: a test run in the background (CI) inherits SIGINT ignored.
    // SAFETY: signal(2) is async-signal-safe; it only resets one disposition in the child.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    for _ in 0..2 {
        lines.next().ok_or("tail ended")??;
    }
    // What is followed, not how fast (the readiness lag is the event_store bench's figure):
    // each append from this process reaches the follower, in order.
    for i in 0..3 {
        store.append(
            "notes",
            ExpectedVersion::Any,
            &[NewEvent::new("host.note", 1, serde_json::json!({"n": i}))],
        )?;
        let got: Value = serde_json::from_str(&lines.next().ok_or("tail ended")??)?;
        assert_eq!(got["payload"]["n"], i);
    }
    // SIGINT ends it at once, saying nothing.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait()?;
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().ok_or("no stderr")?, &mut err)?;
    assert!(err.is_empty(), "{err}");
    // A reader that goes away ends it cleanly.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} log tail -f {} | head -3",
            env!("CARGO_BIN_EXE_correx"),
            db.display()
        ))
        .stderr(Stdio::piped())
        .output()?;
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout)?.lines().count(), 3);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn verify_passes_a_sound_log_and_names_each_problem_of_a_damaged_one() -> TestResult {
    let tmp = TempDir::new("cli-verify");
    let db = tmp.join("events.db");
    drop(write_log(&db)?);
    let dbs = db.to_string_lossy().into_owned();
    let (code, out, err) = run(&["log", "verify", &dbs])?;
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("ok: 9 events in 4 streams"), "{out}");
    {
        let conn = rusqlite::Connection::open(&db)?;
        // A gap in session-s1 (its version 2 is gone), a payload that is not JSON, and a known
        // type whose payload does not match its schema.
        conn.execute("DELETE FROM events WHERE position = 3", [])?;
        conn.execute(
            "UPDATE events SET payload = 'not json' WHERE position = 5",
            [],
        )?;
        conn.execute(
            "UPDATE events SET payload = '{\"model_id\": 3}' WHERE position = 9",
            [],
        )?;
    }
    let (code, out, err) = run(&["log", "verify", &dbs])?;
    assert_eq!(code, 1);
    assert!(err.contains("6 problem(s)"), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    // Each damaged place is named twice: by the hash chain, and by what it breaks besides.
    for (line, (position, what)) in lines.iter().zip([
        (4, "hash chain breaks"),
        (4, "session-s1"),
        (5, "hash chain breaks"),
        (5, "not JSON"),
        (9, "hash chain breaks"),
        (9, "model.unloaded"),
    ]) {
        assert!(
            line.starts_with(&format!("position {position}:")) && line.contains(what),
            "{out}"
        );
    }
    Ok(())
}

#[test]
fn seal_then_verify_against_the_seal_with_a_key_finds_a_cut_tail() -> TestResult {
    let tmp = TempDir::new("cli-seal");
    let db = tmp.join("events.db");
    drop(write_log(&db)?);
    let (dbs, seals, key) = (
        db.to_string_lossy().into_owned(),
        tmp.join("log.seals").to_string_lossy().into_owned(),
        tmp.join("seal.key").to_string_lossy().into_owned(),
    );
    std::fs::write(&key, "a host's secret\n")?;
    let (code, out, err) = run(&[
        "log",
        "seal",
        &dbs,
        "--key-file",
        &key,
        "--append-to",
        &seals,
    ])?;
    assert_eq!(code, 0, "{err}");
    let printed: Value = serde_json::from_str(out.trim())?;
    assert_eq!(printed["position"], 9);
    assert_eq!(std::fs::read_to_string(&seals)?.trim(), out.trim());
    let (code, out, err) = run(&["log", "verify", &dbs, "--seal", &seals, "--key-file", &key])?;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("the hash chain holds, 1 seal(s) match"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "head: position 9 hash {}",
            printed["hash"].as_str().unwrap_or("?")
        )),
        "{out}"
    );
    // Without the key the seal file is not trusted; with another, its seals are refused.
    let (code, _, err) = run(&["log", "verify", &dbs, "--key-file", &key])?;
    assert_eq!(code, 2, "{err}");
    std::fs::write(tmp.join("other.key"), "another")?;
    let other = tmp.join("other.key").to_string_lossy().into_owned();
    let (code, _, err) = run(&[
        "log",
        "verify",
        &dbs,
        "--seal",
        &seals,
        "--key-file",
        &other,
    ])?;
    assert_eq!(code, 1);
    assert!(
        err.contains("seal line 1") && err.contains("signature"),
        "{err}"
    );
    // The last two events cut off.
    rusqlite::Connection::open(&db)?.execute("DELETE FROM events WHERE position > 7", [])?;
    let (code, out, err) = run(&["log", "verify", &dbs, "--seal", &seals, "--key-file", &key])?;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.starts_with("position 8:") && out.contains("cut off"),
        "{out}"
    );
    assert!(err.contains("1 problem(s)"), "{err}");
    Ok(())
}

#[test]
fn audit_tells_residency_and_every_run_with_its_approval_and_flags_open_ones() -> TestResult {
    let tmp = TempDir::new("cli-audit");
    let db = tmp.join("events.db");
    write_log(&db)?;
    let (code, out, err) = run(&["log", "audit", &db.to_string_lossy()])?;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("gemma") && out.contains("(crashed)") && out.contains("1 inference(s)"),
        "{out}"
    );
    assert!(
        out.contains("file_write (T2)")
            && out.contains("completed in 15 ms")
            && out.contains("approved by host after 40 ms"),
        "{out}"
    );
    assert!(out.contains("denied: denied by the approver"), "{out}");
    assert!(out.contains("STARTED WITHOUT AN OUTCOME"), "{out}");
    assert!(out.contains("1 run(s) started without an outcome"), "{out}");
    let (_, only_s1, _) = run(&["log", "audit", &db.to_string_lossy(), "--session", "s1"])?;
    assert!(!only_s1.contains("inv-3"), "{only_s1}");
    Ok(())
}

#[test]
fn trace_is_chrome_trace_json_whose_spans_match_the_log() -> TestResult {
    let tmp = TempDir::new("cli-trace");
    let db = tmp.join("events.db");
    let store = write_log(&db)?;
    let (code, out, err) = run(&["log", "trace", &db.to_string_lossy()])?;
    assert_eq!(code, 0, "{err}");
    let trace: Value = serde_json::from_str(&out)?;
    let events = trace["traceEvents"].as_array().ok_or("no traceEvents")?;
    let spans: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    // Spans on one track nest: any two are apart, or one holds the other.
    let mut by_track: std::collections::BTreeMap<(u64, u64), Vec<(i64, i64)>> = Default::default();
    for s in &spans {
        let key = (
            s["pid"].as_u64().ok_or("pid")?,
            s["tid"].as_u64().ok_or("tid")?,
        );
        let ts = s["ts"].as_i64().ok_or("ts")?;
        by_track
            .entry(key)
            .or_default()
            .push((ts, ts + s["dur"].as_i64().ok_or("dur")?));
    }
    for (track, v) in by_track {
        for a in &v {
            for b in &v {
                let apart = a.1 <= b.0 || b.1 <= a.0;
                let holds = (a.0 <= b.0 && b.1 <= a.1) || (b.0 <= a.0 && a.1 <= b.1);
                assert!(apart || holds, "spans cross on {track:?}: {a:?} {b:?}");
            }
        }
    }
    let log = store.read_all(1, 100)?;
    let at = |ty: &str, inv: &str| {
        log.iter()
            .find(|e| e.type_id == ty && e.payload["invocation_id"] == inv)
            .map(|e| e.timestamp_ms * 1000)
    };
    let start = at("tool.execution_started", "inv-1").ok_or("no start")?;
    let end = at("tool.execution_completed", "inv-1").ok_or("no end")?;
    let decided = at("tool.approval_decided", "inv-1").ok_or("no decision")?;
    let write = spans
        .iter()
        .find(|s| s["name"] == "file_write" && s["args"]["invocation_id"] == "inv-1")
        .ok_or("no file_write span")?;
    let of_run = |name: &str| {
        spans
            .iter()
            .find(|s| s["name"] == name && s["tid"] == write["tid"] && s["pid"] == 2)
            .copied()
    };
    let running = of_run("running").ok_or("no running span")?;
    let approval = of_run("approval").ok_or("no approval span")?;
    // The run starts when it was asked (the decision less its 40 ms wait) and ends with its
    // outcome; it ran from its start event.
    let (wts, wdur) = (
        write["ts"].as_i64().unwrap_or(0),
        write["dur"].as_i64().unwrap_or(0),
    );
    assert_eq!(wts, decided - 40_000);
    assert_eq!(wts + wdur, end);
    assert_eq!(approval["ts"], write["ts"]);
    assert_eq!(approval["dur"].as_i64(), Some(40_000));
    assert_eq!(running["ts"].as_i64(), Some(start));
    assert_eq!(running["dur"].as_i64(), Some(end - start));
    let resident = spans
        .iter()
        .find(|s| s["name"] == "gemma resident")
        .ok_or("no residency")?;
    assert_eq!(resident["ts"].as_i64(), Some(log[0].timestamp_ms * 1000));
    assert_eq!(resident["args"]["reason"], "crashed");
    let inference = spans
        .iter()
        .find(|s| s["name"] == "inference")
        .ok_or("no inference")?;
    let (its, idur) = (
        inference["ts"].as_i64().unwrap_or(0),
        inference["dur"].as_i64().unwrap_or(0),
    );
    let (rts, rdur) = (
        resident["ts"].as_i64().unwrap_or(0),
        resident["dur"].as_i64().unwrap_or(0),
    );
    assert!(
        its >= rts && its + idur <= rts + rdur,
        "the inference is outside its residency"
    );
    let instants: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "i")
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(
        instants.contains(&"gemma crashed") && instants.contains(&"shell rejected"),
        "{instants:?}"
    );
    Ok(())
}

#[test]
fn doctor_reports_a_missing_llama_server_and_fails() -> TestResult {
    let tmp = TempDir::new("cli-doctor");
    let config = tmp.join("config.json");
    std::fs::write(
        &config,
        serde_json::json!({"v": 1, "event_log": tmp.join("e.db"),
            "models": {"server_bin": "/nonexistent/llama-server", "max_loaded": 2}})
        .to_string(),
    )?;
    let (code, out, err) = run(&[
        "doctor",
        "--config",
        &config.to_string_lossy(),
        "--no-serve",
    ])?;
    assert_eq!(code, 1, "{out}{err}");
    let missing = out
        .lines()
        .find(|l| l.contains("llama-server"))
        .ok_or("no llama-server line")?;
    assert!(
        missing.starts_with("missing") && missing.contains("/nonexistent/llama-server"),
        "{missing}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("ok") && l.contains("SQLite")),
        "{out}"
    );
    assert!(out.contains("at most 2 spawned model(s)"), "{out}");
    // Which filesystem a confined run sees here (on this machine: a view of its own).
    let view = out
        .lines()
        .find(|l| l.contains("filesystem view"))
        .ok_or("no filesystem view line")?;
    assert!(
        view.starts_with("ok") && view.contains("only what it is granted"),
        "{view}"
    );
    assert!(err.contains("requirement(s) missing"), "{err}");
    Ok(())
}

#[test]
fn tool_run_asks_on_the_terminal_and_records_a_denial_and_an_approval() -> TestResult {
    let tmp = TempDir::new("cli-tool");
    let work = tmp.join("work");
    std::fs::create_dir_all(&work)?;
    let sandbox = tmp.join("sandbox");
    let db = tmp.join("events.db");
    let config = tmp.join("config.json");
    std::fs::write(
        &config,
        serde_json::json!({"v": 1, "event_log": db, "sandbox_root": sandbox,
            "tools": {"file_write": {"enabled": true, "allowed_paths": [work]}}})
        .to_string(),
    )?;
    let target = work.join("hello.txt");
    let params =
        serde_json::json!({"operation": "write", "path": target, "content": "hi"}).to_string();
    let ask = |answer: &str| -> Result<(i32, String), Box<dyn std::error::Error>> {
        let mut child = correx()
            .args([
                "tool",
                "run",
                "--config",
                &config.to_string_lossy(),
                "--session",
                "cli-test",
            ])
            .args(["file_write", &params])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .ok_or("no stdin")?
            .write_all(answer.as_bytes())?;
        let out = child.wait_with_output()?;
        Ok((
            out.status.code().unwrap_or(-1),
            String::from_utf8(out.stderr)?,
        ))
    };
    let (code, err) = ask("n\n")?;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("file_write (T2)"), "{err}");
    assert!(!target.exists());
    let (code, err) = ask("y\n")?;
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&target)?, "hi");
    let store = SqliteEventStore::open(&db)?;
    let types: Vec<String> = store
        .read_stream("session-cli-test", 1, 100)?
        .into_iter()
        .map(|e| e.type_id)
        .collect();
    assert_eq!(
        types,
        [
            "tool.approval_decided",
            "tool.execution_rejected",
            "tool.approval_decided",
            "tool.execution_started",
            "tool.execution_completed"
        ]
    );
    Ok(())
}

/// Once in a real pseudo-terminal: colour and aligned columns; `NO_COLOR` turns colour off.
#[test]
fn show_on_a_terminal_is_aligned_and_coloured_unless_no_color() -> TestResult {
    let tmp = TempDir::new("cli-pty");
    let db = tmp.join("events.db");
    write_log(&db)?;
    let cmd = format!("{} log show {}", env!("CARGO_BIN_EXE_correx"), db.display());
    let in_pty = |no_color: bool| -> Result<String, Box<dyn std::error::Error>> {
        let mut c = Command::new("script");
        c.args(["-qec", &cmd, "/dev/null"]).env_remove("NO_COLOR");
        if no_color {
            c.env("NO_COLOR", "1");
        }
        let out = c.stdin(Stdio::null()).output()?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?.replace('\r', ""))
    };
    let coloured = in_pty(false)?;
    assert!(coloured.contains("\x1b[36mmodel.loaded"), "{coloured:?}");
    let plain = in_pty(true)?;
    assert!(!plain.contains('\x1b'), "{plain:?}");
    let rows: Vec<&str> = plain.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(rows.len(), 9, "{plain}");
    // The summary column starts at the same place on every row.
    let summary_at = |row: &str, text: &str| row.find(text);
    let first = summary_at(rows[0], "model gemma loaded").ok_or("no summary")?;
    let last = summary_at(rows[8], "model gemma unloaded").ok_or("no summary")?;
    assert_eq!(first, last, "{plain}");
    Ok(())
}

/// A word that is not UTF-8 is a usage error (exit 2) naming it, not a panic.
#[test]
fn an_argument_that_is_not_utf8_is_a_usage_error() -> Result<(), Box<dyn std::error::Error>> {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"/tmp/\xffevents.db");
    let out = correx()
        .args([
            std::ffi::OsStr::new("log"),
            std::ffi::OsStr::new("show"),
            bad,
        ])
        .stdin(Stdio::null())
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("argument 3") && err.contains("not valid UTF-8"),
        "{err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("internal error"),
        "{err}"
    );
    Ok(())
}

/// `correx session signal` answers a wait another process recorded; a second signal of the
/// name fails naming the first; a payload that is not JSON is a usage error.
#[test]
fn session_signal_answers_a_recorded_wait() -> TestResult {
    let tmp = TempDir::new("cli-signal");
    let db = tmp.join("events.db");
    let store = std::sync::Arc::new(SqliteEventStore::open(&db)?);
    let session = correx::Session::open(store.clone(), "s1")?;
    let cancel = correx::CancelToken::new();
    let waiting = session.wait("deploy", "go", Duration::ZERO, &cancel);
    assert!(matches!(waiting, Err(correx::SessionError::Waiting { .. })));
    let db = db.display().to_string();
    let (code, out, err) = run(&[
        "session",
        "signal",
        &db,
        "s1",
        "go",
        r#"{"ok": true}"#,
        "--by",
        "tester",
    ])?;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("signal \"go\" sent to session s1 by tester"),
        "{out}"
    );
    let got = session.wait("deploy", "go", Duration::ZERO, &cancel)?;
    assert_eq!(got.value, serde_json::json!({"ok": true}));
    let (code, _, err) = run(&["session", "signal", &db, "s1", "go"])?;
    assert_ne!(code, 0);
    assert!(err.contains("already sent"), "{err}");
    let (code, _, err) = run(&["session", "signal", &db, "s1", "other", "{not json"])?;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("PAYLOAD is not JSON"), "{err}");
    Ok(())
}
