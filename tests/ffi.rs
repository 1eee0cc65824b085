//! The C ABI called from Rust: cancellation from another thread, and the panic guard.

use crate::util::{free_port, llama_install, TempDir};
use correx::ffi::*;
use std::ffi::{CStr, CString};
use std::ptr;
use std::time::{Duration, Instant};

type TestResult = Result<(), Box<dyn std::error::Error>>;

pub(crate) struct Rt(pub(crate) *mut correx_runtime);

// SAFETY: correx_runtime is documented as shareable across threads.
unsafe impl Send for Rt {}
// SAFETY: as above.
unsafe impl Sync for Rt {}

impl Drop for Rt {
    fn drop(&mut self) {
        // SAFETY: made by correx_runtime_new, freed once here.
        unsafe { correx_runtime_free(self.0) };
    }
}

struct Cancel(*mut correx_cancel);
// SAFETY: the flag is documented as usable from any thread.
unsafe impl Send for Cancel {}
// SAFETY: as above.
unsafe impl Sync for Cancel {}

impl Drop for Cancel {
    fn drop(&mut self) {
        // SAFETY: made by correx_cancel_new, freed once here.
        unsafe { correx_cancel_free(self.0) };
    }
}

fn runtime(dir: &TempDir, port: u16) -> Result<Rt, Box<dyn std::error::Error>> {
    let config = serde_json::json!({
        "v": 1,
        "event_log": dir.join("events.db"),
        "sandbox_root": dir.join("sb"),
        "models": {"port": port, "log_dir": dir.join("logs")},
    })
    .to_string();
    let config = CString::new(config)?;
    let mut rt = ptr::null_mut();
    // SAFETY: valid string and out-params.
    let rc = unsafe { correx_runtime_new(config.as_ptr(), &mut rt, ptr::null_mut()) };
    assert_eq!(rc, CORREX_OK);
    Ok(Rt(rt))
}

fn cancel() -> Cancel {
    let mut c = ptr::null_mut();
    // SAFETY: valid out-param.
    assert_eq!(
        unsafe { correx_cancel_new(&mut c, ptr::null_mut()) },
        CORREX_OK
    );
    Cancel(c)
}

const DESCRIPTOR: &str = r#"{"v": 1, "model_id": "g", "residency": "persistent", "context_size": 1024, "extra_args": ["--no-jinja", "--chat-template", "gemma"]}"#;

#[test]
fn a_load_and_an_infer_can_be_cancelled_from_another_thread() -> TestResult {
    if llama_install().is_none() {
        return Ok(());
    }
    let dir = TempDir::new("ffi-cancel");
    let port = free_port();
    let rt = std::sync::Arc::new(runtime(&dir, port)?);
    let flag = std::sync::Arc::new(cancel());
    let descriptor = CString::new(DESCRIPTOR)?;

    // Cancel a load 100 ms in (a load takes about a second).
    let trigger = {
        let flag = flag.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            // SAFETY: the flag outlives this thread (the test joins it first).
            unsafe { correx_cancel_trigger(flag.0) };
        })
    };
    let mut err = ptr::null_mut();
    // SAFETY: live runtime, valid strings, err out-param.
    let rc = unsafe { correx_model_load(rt.0, descriptor.as_ptr(), flag.0, &mut err) };
    trigger.join().map_err(|_| "trigger panicked")?;
    assert_eq!(rc, CORREX_E_CANCELLED);
    // SAFETY: err was set on failure.
    unsafe { correx_error_free(err) };
    assert!(
        std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
        "the cancelled server still runs"
    );

    // SAFETY: as above.
    unsafe { correx_cancel_reset(flag.0) };
    // SAFETY: as above.
    assert_eq!(
        unsafe { correx_model_load(rt.0, descriptor.as_ptr(), flag.0, ptr::null_mut()) },
        CORREX_OK
    );

    // A long generation, cancelled 200 ms in, returns at once.
    let request = CString::new(
        r#"{"v": 1, "context": {"task": "Write a very long story."}, "config": {"max_tokens": 2000, "temperature": 0}}"#,
    )?;
    let model = CString::new("g")?;
    let trigger = {
        let flag = flag.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            // SAFETY: as above.
            unsafe { correx_cancel_trigger(flag.0) };
        })
    };
    let started = Instant::now();
    let mut out = ptr::null_mut();
    // SAFETY: live runtime, valid strings and out-params.
    let rc = unsafe {
        correx_infer(
            rt.0,
            model.as_ptr(),
            request.as_ptr(),
            flag.0,
            &mut out,
            ptr::null_mut(),
        )
    };
    trigger.join().map_err(|_| "trigger panicked")?;
    assert_eq!(rc, CORREX_E_CANCELLED);
    assert!(out.is_null(), "out-param written on error");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cancel took {:?}",
        started.elapsed()
    );
    Ok(())
}

#[test]
fn infer_through_the_abi_returns_v1_json() -> TestResult {
    if llama_install().is_none() {
        return Ok(());
    }
    let dir = TempDir::new("ffi-infer");
    let rt = runtime(&dir, free_port())?;
    let descriptor = CString::new(DESCRIPTOR)?;
    // SAFETY: live runtime and valid strings.
    assert_eq!(
        unsafe { correx_model_load(rt.0, descriptor.as_ptr(), ptr::null(), ptr::null_mut()) },
        CORREX_OK
    );
    let request = CString::new(
        r#"{"v": 1, "context": {"task": "Hi"}, "config": {"max_tokens": 3, "temperature": 0, "seed": 1}}"#,
    )?;
    let model = CString::new("g")?;
    let mut out = ptr::null_mut();
    // SAFETY: as above.
    let rc = unsafe {
        correx_infer(
            rt.0,
            model.as_ptr(),
            request.as_ptr(),
            ptr::null(),
            &mut out,
            ptr::null_mut(),
        )
    };
    assert_eq!(rc, CORREX_OK);
    // SAFETY: out is a NUL-terminated string from correx.
    let text = unsafe { CStr::from_ptr(out) }.to_str()?.to_owned();
    // SAFETY: freed once.
    unsafe { correx_string_free(out) };
    let v: serde_json::Value = serde_json::from_str(&text)?;
    assert_eq!(v["v"], 1);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["finish_reason"], "length");
    let mut count = 0u64;
    let t = CString::new("hello world")?;
    // SAFETY: as above.
    assert_eq!(
        unsafe { correx_count_tokens(rt.0, t.as_ptr(), &mut count, ptr::null_mut()) },
        CORREX_OK
    );
    assert!(count >= 2);
    Ok(())
}

/// An array where an object belongs is refused, at any depth: serde's derive alone binds it by
/// position (found by the C-ABI battery: an event made of `["pos-1","t",1,null,null,{...}]`).
#[test]
fn an_array_where_an_object_belongs_is_invalid() -> TestResult {
    let dir = TempDir::new("ffi-arrays");
    let rt = runtime(&dir, free_port())?;
    let append = |events: &str| -> i32 {
        let stream = CString::new("arrays").unwrap_or_default();
        let events = CString::new(events).unwrap_or_default();
        let mut out = ptr::null_mut();
        let mut err = ptr::null_mut();
        // SAFETY: valid runtime, strings and out-params; what comes back is freed below.
        let rc = unsafe {
            correx_events_append(
                rt.0,
                stream.as_ptr(),
                CORREX_EXPECT_ANY,
                0,
                events.as_ptr(),
                &mut out,
                &mut err,
            )
        };
        // SAFETY: each was made by the call above (or is NULL), and is freed once.
        unsafe {
            correx_string_free(out);
            correx_error_free(err);
        }
        rc
    };
    let event = r#"{"type_id": "t", "schema_version": 1, "payload": {"a": 1}}"#;
    assert_eq!(
        append(&format!(r#"{{"v": 1, "events": [{event}]}}"#)),
        CORREX_OK
    );
    assert_eq!(
        append(r#"{"v": 1, "events": [["pos-1", "t", 1, null, null, {"a": 1}]]}"#),
        CORREX_E_INVALID_ARGUMENT
    );
    Ok(())
}

/// `correx_session_end` refuses the ids every other session call refuses (empty, over 256
/// bytes, a control character), with the same message, and ends a valid one.
#[test]
fn session_end_takes_only_ids_a_session_call_takes() -> TestResult {
    let dir = TempDir::new("ffi-session-end");
    let rt = runtime(&dir, free_port())?;
    let end = |id: &str| -> (i32, String) {
        let id = CString::new(id).unwrap_or_default();
        let mut err = ptr::null_mut();
        // SAFETY: valid runtime, string and out-param; the error is read and freed below.
        let rc = unsafe { correx_session_end(rt.0, id.as_ptr(), &mut err) };
        // SAFETY: err is NULL or an error made by the call above, freed once.
        let message = unsafe {
            let m = correx_error_message(err);
            let text = if m.is_null() {
                String::new()
            } else {
                CStr::from_ptr(m).to_string_lossy().into_owned()
            };
            correx_error_free(err);
            text
        };
        (rc, message)
    };
    for bad in ["", &"s".repeat(257), "a\u{1b}b"] {
        let (rc, message) = end(bad);
        assert_eq!(rc, CORREX_E_INVALID_ARGUMENT, "{bad:?}");
        assert!(
            message.contains("a session id is 1 to 256 bytes"),
            "{message}"
        );
    }
    assert_eq!(end("s1"), (CORREX_OK, String::new()));
    Ok(())
}

/// A panic inside correx is caught at the C boundary: the call returns `CORREX_E_PANIC`, the
/// handle answers `CORREX_E_UNUSABLE` from then on, and freeing it still works (the drop).
#[test]
fn a_panic_is_caught_and_leaves_the_handle_unusable() -> TestResult {
    let dir = TempDir::new("ffi-panic");
    let rt = runtime(&dir, free_port())?;
    let mut n = 0u64;
    // SAFETY: a valid runtime and out-param; no error is asked for.
    let before = unsafe { correx_events_last_position(rt.0, &mut n, ptr::null_mut()) };
    assert_eq!(before, CORREX_OK);
    let mut err = ptr::null_mut();
    // SAFETY: a valid runtime and error out-param.
    assert_eq!(
        unsafe { correx_debug_panic(rt.0, &mut err) },
        CORREX_E_PANIC
    );
    // SAFETY: set by the failed call above, freed once.
    unsafe { correx_error_free(err) };
    // SAFETY: as before.
    let after = unsafe { correx_events_last_position(rt.0, &mut n, ptr::null_mut()) };
    assert_eq!(after, CORREX_E_UNUSABLE);
    let request = CString::new(r#"{"v":1,"session_id":"s","tool_name":"nope"}"#)?;
    let mut out = ptr::null_mut();
    // SAFETY: a valid runtime, string and out-param.
    let rc = unsafe { correx_tool_execute(rt.0, request.as_ptr(), &mut out, ptr::null_mut()) };
    assert_eq!((rc, out.is_null()), (CORREX_E_UNUSABLE, true));
    Ok(())
}

/// Calls a JSON-answering export: its code, and its JSON (or its error's message).
pub(crate) fn call_json(
    f: impl FnOnce(*mut *mut std::ffi::c_char, *mut *mut correx_error) -> i32,
) -> (i32, String) {
    let mut out = ptr::null_mut();
    let mut err = ptr::null_mut();
    let rc = f(&mut out, &mut err);
    // SAFETY: out and err are NULL or made by the call above, read and freed once here.
    let text = unsafe {
        let text = if out.is_null() {
            let m = correx_error_message(err);
            if m.is_null() {
                String::new()
            } else {
                CStr::from_ptr(m).to_string_lossy().into_owned()
            }
        } else {
            CStr::from_ptr(out).to_string_lossy().into_owned()
        };
        correx_string_free(out);
        correx_error_free(err);
        text
    };
    (rc, text)
}

/// The C approver that defers every request.
unsafe extern "C" fn defer_all(
    _user_data: *mut std::ffi::c_void,
    _tool: *const std::ffi::c_char,
    _tier: i32,
    _request_json: *const std::ffi::c_char,
) -> i32 {
    CORREX_DEFER
}

#[test]
fn a_deferred_run_is_pending_through_the_abi_and_runs_once_after_a_decision() -> TestResult {
    let dir = TempDir::new("ffi-approvals");
    let work = dir.join("work");
    std::fs::create_dir_all(&work)?;
    std::fs::write(work.join("m.txt"), "")?;
    let config = serde_json::json!({
        "v": 1,
        "event_log": dir.join("events.db"),
        "sandbox_root": dir.join("sb"),
        "tools": {"file_edit": {"enabled": true, "allowed_paths": [&work]}},
    })
    .to_string();
    let config = CString::new(config)?;
    let mut raw = ptr::null_mut();
    // SAFETY: valid string and out-params.
    assert_eq!(
        unsafe { correx_runtime_new(config.as_ptr(), &mut raw, ptr::null_mut()) },
        CORREX_OK
    );
    let rt = Rt(raw);
    // SAFETY: a valid runtime and a callback that needs no user data.
    let rc = unsafe {
        correx_runtime_set_approver(
            rt.0,
            Some(defer_all),
            ptr::null_mut(),
            None,
            ptr::null_mut(),
        )
    };
    assert_eq!(rc, CORREX_OK);
    let (session, step) = (CString::new("c1")?, CString::new("edit")?);
    let request = CString::new(
        serde_json::json!({"v": 1, "tool_name": "file_edit", "parameters":
            {"operation": "append", "path": work.join("m.txt"), "content": "c\n"}})
        .to_string(),
    )?;
    let execute = || {
        call_json(|out, err| {
            // SAFETY: valid runtime, strings and out-params; no cancel token.
            unsafe {
                correx_session_execute(
                    rt.0,
                    session.as_ptr(),
                    step.as_ptr(),
                    request.as_ptr(),
                    ptr::null(),
                    out,
                    err,
                )
            }
        })
    };
    let (rc, message) = execute();
    assert_eq!(rc, CORREX_E_PENDING, "{message}");
    assert_eq!(std::fs::read_to_string(work.join("m.txt"))?, "");

    let (rc, listed) = call_json(|out, err| {
        // SAFETY: valid runtime, string and out-params.
        unsafe { correx_approvals_list(rt.0, session.as_ptr(), 0, out, err) }
    });
    assert_eq!(rc, CORREX_OK, "{listed}");
    let listed: serde_json::Value = serde_json::from_str(&listed)?;
    let id = listed["requests"][0]["request_id"]
        .as_str()
        .ok_or("a request")?
        .to_owned();
    assert!(
        message.contains(&id),
        "the pending error names the request: {message}"
    );
    let id = CString::new(id)?;

    let decide = |json: &str| {
        let json = CString::new(json).unwrap_or_default();
        call_json(|out, err| {
            // SAFETY: valid runtime, strings and out-params.
            unsafe {
                correx_approvals_decide(
                    rt.0,
                    session.as_ptr(),
                    id.as_ptr(),
                    json.as_ptr(),
                    out,
                    err,
                )
            }
        })
    };
    // A wrong shape is invalid; an unknown request is not found.
    assert_eq!(
        decide(r#"{"v": 1, "decision": ["approve"], "identity": "a"}"#).0,
        CORREX_E_INVALID_ARGUMENT
    );
    assert_eq!(
        decide(r#"{"v": 1, "decision": "approve", "identity": ""}"#).0,
        CORREX_E_INVALID_ARGUMENT
    );
    let (rc, decided) = decide(r#"{"v": 1, "decision": "approve", "identity": "alice"}"#);
    assert_eq!(rc, CORREX_OK, "{decided}");
    assert!(decided.contains("\"identity\":\"alice\""), "{decided}");
    let (rc, second) = decide(r#"{"v": 1, "decision": "deny", "identity": "bob"}"#);
    assert_eq!(rc, CORREX_E_CONFLICT);
    assert!(second.contains("alice"), "{second}");

    // Asked again: answered from the recorded decision (the callback would defer again).
    let (rc, done) = execute();
    assert_eq!(rc, CORREX_OK, "{done}");
    assert!(done.contains("\"status\":\"success\""), "{done}");
    let (rc, again) = execute();
    assert_eq!(rc, CORREX_OK);
    assert!(again.contains("\"replayed\":true"), "{again}");
    assert_eq!(std::fs::read_to_string(work.join("m.txt"))?, "c\n");
    Ok(())
}

/// `correx_embed`: vectors in input order on an embedding model, the same for the same text;
/// a chat model, a wrong shape, no inputs and an unknown model are clear errors.
#[test]
fn embeddings_through_the_abi() -> TestResult {
    if llama_install().is_none() {
        return Ok(());
    }
    let dir = TempDir::new("ffi-embed");
    let rt = runtime(&dir, free_port())?;
    let load = |d: &str| -> Result<i32, Box<dyn std::error::Error>> {
        let d = CString::new(d)?;
        // SAFETY: live runtime and a valid string.
        Ok(unsafe { correx_model_load(rt.0, d.as_ptr(), ptr::null(), ptr::null_mut()) })
    };
    assert_eq!(
        load(
            r#"{"v": 1, "model_id": "e", "residency": "persistent", "context_size": 1024, "serves": "embeddings"}"#
        )?,
        CORREX_OK
    );
    assert_eq!(load(DESCRIPTOR)?, CORREX_OK);
    let embed = |model: &str, inputs: &str| -> (i32, String) {
        let (model, inputs) = (
            CString::new(model).unwrap_or_default(),
            CString::new(inputs).unwrap_or_default(),
        );
        // SAFETY: live runtime, valid strings, out-params from call_json.
        call_json(|out, err| unsafe {
            correx_embed(rt.0, model.as_ptr(), inputs.as_ptr(), ptr::null(), out, err)
        })
    };
    let (rc, text) = embed(
        "e",
        r#"{"v": 1, "inputs": ["the sea", "a cat", "the sea"]}"#,
    );
    assert_eq!(rc, CORREX_OK, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text)?;
    assert_eq!(v["v"], 1);
    assert_eq!(v["model"], "e");
    let vectors = v["vectors"].as_array().ok_or("no vectors")?;
    assert_eq!(vectors.len(), 3);
    assert!(vectors[0].as_array().is_some_and(|x| x.len() > 16));
    assert!(vectors[0] != vectors[1], "two texts, one vector");
    // One text, the same vector every call (within a batch its bits can differ by position).
    let one = || -> Result<serde_json::Value, Box<dyn std::error::Error>> {
        let (rc, text) = embed("e", r#"{"v": 1, "inputs": ["a cat"]}"#);
        assert_eq!(rc, CORREX_OK, "{text}");
        Ok(serde_json::from_str::<serde_json::Value>(&text)?["vectors"][0].clone())
    };
    assert!(one()? == one()?, "the same text gave another vector");
    for (model, inputs, code) in [
        (
            "g",
            r#"{"v": 1, "inputs": ["x"]}"#,
            CORREX_E_INVALID_ARGUMENT,
        ),
        ("e", r#"{"v": 1, "inputs": []}"#, CORREX_E_INVALID_ARGUMENT),
        (
            "e",
            r#"{"v": 1, "inputs": [""]}"#,
            CORREX_E_INVALID_ARGUMENT,
        ),
        ("e", r#"{"v": 1, "inputs": "x"}"#, CORREX_E_INVALID_ARGUMENT),
        ("e", r#"[1, ["x"]]"#, CORREX_E_INVALID_ARGUMENT),
        (
            "e",
            r#"{"v": 1, "inputs": ["x"], "more": 1}"#,
            CORREX_E_INVALID_ARGUMENT,
        ),
        (
            "nope",
            r#"{"v": 1, "inputs": ["x"]}"#,
            CORREX_E_UNKNOWN_MODEL,
        ),
    ] {
        let (rc, message) = embed(model, inputs);
        assert_eq!(rc, code, "{model} {inputs}: {message}");
        assert!(!message.is_empty(), "{model} {inputs}: no message");
    }
    Ok(())
}

/// `correx_session_wait` and `correx_session_signal`: a wait is pending until a signal, then
/// answers with its payload, from the log after; a second signal of the name and wrong shapes
/// are typed errors.
#[test]
fn a_session_wait_is_answered_by_a_signal_through_the_abi() -> TestResult {
    let dir = TempDir::new("ffi-wait");
    let rt = runtime(&dir, free_port())?;
    let session = CString::new("abi-wait")?;
    let step = CString::new("confirm")?;
    let wait = |json: &str| -> (i32, String) {
        let json = CString::new(json).unwrap_or_default();
        // SAFETY: live runtime, valid strings, out-params from call_json.
        call_json(|out, err| unsafe {
            correx_session_wait(
                rt.0,
                session.as_ptr(),
                step.as_ptr(),
                json.as_ptr(),
                ptr::null(),
                out,
                err,
            )
        })
    };
    let signal = |json: &str| -> (i32, String) {
        let json = CString::new(json).unwrap_or_default();
        // SAFETY: as above.
        call_json(|out, err| unsafe {
            correx_session_signal(rt.0, session.as_ptr(), json.as_ptr(), out, err)
        })
    };
    let (rc, message) = wait(r#"{"v": 1, "name": "go"}"#);
    assert_eq!(rc, CORREX_E_PENDING, "{message}");
    assert!(message.contains("\"go\""), "{message}");
    let (rc, sent) = signal(r#"{"v": 1, "name": "go", "payload": {"ok": 1}, "by": "me"}"#);
    assert_eq!(rc, CORREX_OK, "{sent}");
    let sent: serde_json::Value = serde_json::from_str(&sent)?;
    assert!(sent["position"].as_u64() > Some(0));
    let (rc, got) = wait(r#"{"v": 1, "name": "go", "wait_ms": 1000}"#);
    assert_eq!(rc, CORREX_OK, "{got}");
    let got: serde_json::Value = serde_json::from_str(&got)?;
    assert_eq!(got["payload"], serde_json::json!({"ok": 1}));
    assert_eq!(got["replayed"], false);
    let (_, again) = wait(r#"{"v": 1, "name": "go"}"#);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&again)?["replayed"],
        true
    );
    let (rc, m) = signal(r#"{"v": 1, "name": "go", "payload": 2}"#);
    assert_eq!(rc, CORREX_E_CONFLICT, "{m}");
    for bad in [
        r#"{"v": 1, "name": ""}"#,
        r#"{"v": 1, "name": "go", "extra": 1}"#,
        r#"["go"]"#,
        r#"{"name": "go"}"#,
    ] {
        assert_eq!(signal(bad).0, CORREX_E_INVALID_ARGUMENT, "{bad}");
    }
    let (rc, m) = wait(r#"{"v": 1, "name": "other"}"#);
    assert_eq!(rc, CORREX_E_CONFLICT, "a key is one signal's: {m}");
    Ok(())
}
