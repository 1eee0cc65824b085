//! Evidence someone else can check: Ed25519 checkpoints, a session's bundle that verifies with
//! only the public key, consistency proofs, and `verify` saying one break in one line.
//!
//! The attacks are a holder of the bundle (or of the log file) who changes, removes, adds or
//! reorders events, swaps in another log's or an older checkpoint, or signs with another key.
//! The battery runs as this user and again as nobody.

use crate::util::{become_nobody, child_test, is_child, TempDir};
use correx::evidence::{export_session, verify_bundle, EvidenceError, SigningKey};
use correx::{EventStore, ExpectedVersion, NewEvent, SqliteEventStore};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A log where session `s1` has a stream of its own, tool runs in other streams that name it,
/// and other sessions (`s10`, whose id holds `s1`, among them) interleave with it.
fn write_log(path: &Path) -> TestResult {
    let store = SqliteEventStore::open(path)?;
    for i in 0..12u64 {
        for (s, n) in [("s1", i), ("s10", i), ("s2", i)] {
            let e = NewEvent::new("note.step", 1, json!({"session_id": s, "n": n}));
            store.append(&format!("session-{s}"), ExpectedVersion::Any, &[e])?;
        }
        if i % 3 == 0 {
            let e = NewEvent::new(
                "note.tool",
                1,
                json!({"session_id": "s1", "invocation_id": format!("inv-{i}")}),
            );
            store.append(&format!("tool-{i}"), ExpectedVersion::NoStream, &[e])?;
        }
        let e = NewEvent::new(
            "note.added",
            1,
            json!({"text": "s1 is mentioned, not named"}),
        );
        store.append("notes", ExpectedVersion::Any, &[e])?;
    }
    Ok(())
}

fn key(dir: &Path, name: &str) -> Result<SigningKey, EvidenceError> {
    SigningKey::generate(&dir.join(name))
}

fn events(b: &Value) -> Vec<Value> {
    b["events"].as_array().cloned().unwrap_or_default()
}

fn with_events(b: &Value, events: Vec<Value>) -> Value {
    let mut b = b.clone();
    b["events"] = Value::Array(events);
    b
}

/// Every way of changing the bundle's events an attacker has; each must be refused.
fn tampered(b: &Value, other_session: &Value) -> Vec<(String, Value)> {
    let ev = events(b);
    let mut out = Vec::new();
    for i in 0..ev.len() {
        for (field, value) in [
            (
                "payload",
                json!(format!("{} ", ev[i]["payload"].as_str().unwrap_or(""))),
            ),
            ("type_id", json!("note.other")),
            (
                "stream_version",
                json!(ev[i]["stream_version"].as_u64().unwrap_or(0) + 1),
            ),
            (
                "timestamp_ms",
                json!(ev[i]["timestamp_ms"].as_i64().unwrap_or(0) + 1),
            ),
            (
                "position",
                json!(ev[i]["position"].as_u64().unwrap_or(0) + 1),
            ),
            (
                "leaf_index",
                json!(ev[i]["leaf_index"].as_u64().unwrap_or(0) + 1),
            ),
            ("correlation_id", json!("c")),
            ("previous", json!("22".repeat(32))),
        ] {
            let mut changed = ev.clone();
            changed[i][field] = value;
            out.push((
                format!("event {i}: {field} changed"),
                with_events(b, changed),
            ));
        }
        let mut proof = ev.clone();
        if let Some(first) = proof[i]["proof"].get_mut(0) {
            *first = json!("11".repeat(32));
            out.push((format!("event {i}: proof changed"), with_events(b, proof)));
        }
        let mut removed = ev.clone();
        removed.remove(i);
        out.push((format!("event {i} removed"), with_events(b, removed)));
        let mut repeated = ev.clone();
        repeated.insert(i, ev[i].clone());
        out.push((format!("event {i} repeated"), with_events(b, repeated)));
        if i + 1 < ev.len() {
            let mut swapped = ev.clone();
            swapped.swap(i, i + 1);
            out.push((
                format!("events {i} and {} swapped", i + 1),
                with_events(b, swapped),
            ));
        }
    }
    // Another session's event, with its own valid proof against the same checkpoint.
    let foreign = events(other_session);
    for (j, e) in foreign.iter().enumerate().take(3) {
        let mut added = ev.clone();
        let at = added
            .iter()
            .position(|x| x["leaf_index"].as_u64() > e["leaf_index"].as_u64())
            .unwrap_or(added.len());
        added.insert(at, e.clone());
        out.push((
            format!("another session's event {j} added"),
            with_events(b, added),
        ));
    }
    let mut session = b.clone();
    session["session"] = json!("s2");
    out.push(("the session renamed".into(), session));
    let mut unsigned = b.clone();
    unsigned["ed25519"] = json!("00".repeat(64));
    out.push(("the statement's signature changed".into(), unsigned));
    let mut checkpoint = b.clone();
    checkpoint["checkpoint"]["tree_size"] =
        json!(b["checkpoint"]["tree_size"].as_u64().unwrap_or(0) - 1);
    out.push(("the checkpoint's tree size changed".into(), checkpoint));
    out
}

fn battery() -> TestResult {
    let tmp = TempDir::new("bundles");
    let dir = tmp.path();
    let db = dir.join("events.db");
    write_log(&db)?;
    let signing = key(dir, "signing.key")?;
    let public = signing.public();
    let bundle = export_session(&db, "s1", &signing)?;
    let report = verify_bundle(&bundle, &public, None)?;
    // Its own stream's 12 and the 4 tool runs that name it; not s10's, nor the notes.
    assert_eq!((report.session.as_str(), report.events), ("s1", 16));
    let other = export_session(&db, "s10", &signing)?;
    assert_eq!(verify_bundle(&other, &public, None)?.events, 12);
    for (what, b) in tampered(&bundle, &other) {
        match verify_bundle(&b, &public, None) {
            Err(EvidenceError::Refused { .. })
            | Err(EvidenceError::BadSignature { .. })
            | Err(EvidenceError::Malformed { .. }) => {}
            Ok(r) => panic!("{what}: the bundle verified ({} events)", r.events),
            Err(e) => panic!("{what}: refused for the wrong reason: {e}"),
        }
    }
    // The signed statement is what finds the last event removed: its own proofs still hold.
    let mut cut = events(&bundle);
    cut.pop();
    let cut = with_events(&bundle, cut);
    let mut unchecked = cut.clone();
    unchecked["ed25519"] = bundle["ed25519"].clone();
    let err = verify_bundle(&unchecked, &public, None)
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("one was removed, added or replaced")),
        "{err:?}"
    );
    // Another key verifies nothing.
    let stranger = key(dir, "stranger.key")?.public();
    assert!(matches!(
        verify_bundle(&bundle, &stranger, None),
        Err(EvidenceError::BadSignature { .. })
    ));
    // A bundle against an older checkpoint, or from another log, is refused when the verifier
    // holds the checkpoint it trusts; the same bundles verify on their own.
    let older = correx::evidence::Checkpoint::from_json(&bundle["checkpoint"], &public)?;
    let store = SqliteEventStore::open(&db)?;
    store.append(
        "session-s1",
        ExpectedVersion::Any,
        &[NewEvent::new("note.step", 1, json!({"session_id": "s1"}))],
    )?;
    drop(store);
    let newer = export_session(&db, "s1", &signing)?;
    let newest = correx::evidence::Checkpoint::from_json(&newer["checkpoint"], &public)?;
    assert_eq!(verify_bundle(&newer, &public, Some(&newest))?.events, 17);
    let err = verify_bundle(&bundle, &public, Some(&newest))
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("not the one given")),
        "{err:?}"
    );
    assert!(older.tree_size < newest.tree_size);
    let db2 = dir.join("other.db");
    write_log(&db2)?;
    let foreign = export_session(&db2, "s1", &signing)?;
    let err = verify_bundle(&foreign, &public, Some(&newest))
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.contains("another log")),
        "{err:?}"
    );
    // Its events carry proofs of the other tree: paired with this log's checkpoint, refused.
    let mut mixed = foreign.clone();
    mixed["checkpoint"] = newer["checkpoint"].clone();
    assert!(verify_bundle(&mixed, &public, None).is_err());
    // A session the log does not hold is an error, not an empty bundle.
    assert!(matches!(
        export_session(&db, "nobody", &signing),
        Err(EvidenceError::Log(_))
    ));
    // A wrong shape anywhere is a typed error.
    for b in [
        json!([]),
        json!({"correx_bundle": 1}),
        with_events(&bundle, vec![json!([1])]),
    ] {
        assert!(verify_bundle(&b, &public, None).is_err());
    }
    Ok(())
}

#[test]
fn a_bundle_verifies_with_only_the_public_key_and_any_change_to_it_is_found() -> TestResult {
    battery()
}

#[test]
fn a_bundle_verifies_with_only_the_public_key_and_any_change_to_it_is_found_as_nobody() -> TestResult
{
    // SAFETY: reading the effective uid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return battery();
    }
    crate::util::assert_child_passes(
        &mut child_test("bundles::battery_as_nobody_child"),
        "battery passed",
        "the bundle battery as nobody",
    )?;
    Ok(())
}

#[test]
#[ignore = "helper: run by the unprivileged variant"]
fn battery_as_nobody_child() {
    if !is_child() {
        return;
    }
    become_nobody();
    battery().expect("the battery");
    println!("battery passed");
}

fn correx(args: &[&str]) -> Result<(i32, String, String), Box<dyn std::error::Error>> {
    let out = Command::new(env!("CARGO_BIN_EXE_correx"))
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    ))
}

#[test]
fn checkpoints_signed_with_ed25519_verify_with_the_public_key_and_prove_the_log_only_grew(
) -> TestResult {
    let tmp = TempDir::new("checkpoints");
    let dir = tmp.path();
    let db = dir.join("events.db");
    write_log(&db)?;
    let (dbs, key, seals) = (
        db.to_string_lossy().into_owned(),
        dir.join("k").to_string_lossy().into_owned(),
        dir.join("seals").to_string_lossy().into_owned(),
    );
    let (code, public, err) = correx(&["log", "keygen", &key])?;
    assert_eq!(code, 0, "{err}");
    let public = public.trim().to_owned();
    assert_eq!(std::fs::metadata(&key)?.permissions().mode() & 0o777, 0o600);
    // Never over an existing key.
    assert_ne!(correx(&["log", "keygen", &key])?.0, 0);
    let (code, line, err) = correx(&[
        "log",
        "seal",
        &dbs,
        "--signing-key",
        &key,
        "--append-to",
        &seals,
    ])?;
    assert_eq!(code, 0, "{err}");
    let first: Value = serde_json::from_str(line.trim())?;
    assert_eq!(first["tree_size"], first["position"]);
    // The signing key is in no output.
    let secret = std::fs::read_to_string(&key)?;
    assert!(!line.contains(secret.trim()));
    let verify = |extra: &[&str]| {
        let mut a = vec!["log", "verify", dbs.as_str(), "--seal", seals.as_str()];
        a.extend_from_slice(extra);
        correx(&a)
    };
    let (code, out, err) = verify(&["--public-key", &public])?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 seal(s) match"), "{out}");
    let old = dir.join("old").to_string_lossy().into_owned();
    std::fs::copy(&seals, &old)?;
    let store = SqliteEventStore::open(&db)?;
    for i in 0..5 {
        store.append(
            "notes",
            ExpectedVersion::Any,
            &[NewEvent::new("note.added", 1, json!({"i": i}))],
        )?;
    }
    drop(store);
    assert_eq!(
        correx(&[
            "log",
            "seal",
            &dbs,
            "--signing-key",
            &key,
            "--append-to",
            &seals
        ])?
        .0,
        0
    );
    assert_eq!(verify(&["--public-key", &public])?.0, 0);
    let (code, proof, err) = correx(&[
        "log",
        "prove-consistency",
        &dbs,
        "--from",
        &old,
        "--to",
        &seals,
        "--public-key",
        &public,
    ])?;
    assert_eq!(code, 0, "{err}");
    let proof_file = dir.join("proof.json");
    std::fs::write(&proof_file, &proof)?;
    let pf = proof_file.to_string_lossy().into_owned();
    let (code, out, err) = correx(&["log", "verify-consistency", &pf, "--public-key", &public])?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("only grew"), "{out}");
    // With another key, or a checkpoint changed by one digit, nothing verifies.
    let other = dir.join("k2").to_string_lossy().into_owned();
    let (_, other_public, _) = correx(&["log", "keygen", &other])?;
    let (code, _, err) = verify(&["--public-key", other_public.trim()])?;
    assert_ne!(code, 0);
    assert!(err.contains("signature does not match"), "{err}");
    let text = std::fs::read_to_string(&seals)?;
    let bumped = text.replacen("\"position\":", "\"position\":1", 1);
    let forged = dir.join("forged").to_string_lossy().into_owned();
    std::fs::write(&forged, bumped)?;
    let (code, _, err) = correx(&[
        "log",
        "verify",
        &dbs,
        "--seal",
        &forged,
        "--public-key",
        &public,
    ])?;
    assert_ne!(code, 0);
    assert!(err.contains("line 1") && err.contains("signature"), "{err}");
    // Someone rewrites an early event and recomputes the whole chain: the checkpoints (head
    // and root) no longer hold, and the old-to-new proof made from the rewritten log fails.
    rusqlite::Connection::open(&db)?.execute_batch(
        "UPDATE events SET payload = '{\"session_id\":\"s1\",\"n\":99}' WHERE position = 2",
    )?;
    crate::evidence::recompute_chain(&db, 2)?;
    let (code, out, _) = verify(&["--public-key", &public])?;
    assert_ne!(code, 0);
    assert!(
        out.contains("another log") || out.contains("Merkle root"),
        "{out}"
    );
    Ok(())
}

#[test]
fn one_inserted_event_is_one_line_of_verify_and_all_lists_every_position() -> TestResult {
    let tmp = TempDir::new("one-break");
    let db = tmp.path().join("events.db");
    let store = SqliteEventStore::open(&db)?;
    for i in 0..51 {
        store.append(
            "notes",
            ExpectedVersion::Any,
            &[NewEvent::new("note.added", 1, json!({"i": i}))],
        )?;
    }
    drop(store);
    // An event inserted at 25, the ones after it moved up by one: every later event's
    // position is part of its hash, so each of them no longer links.
    let conn = rusqlite::Connection::open(&db)?;
    conn.execute_batch(
        "UPDATE events SET position = position + 1000 WHERE position >= 25;
         UPDATE events SET position = position - 999 WHERE position >= 1000;
         INSERT INTO events (position, event_id, stream_id, stream_version, type_id, \
           schema_version, timestamp_ms, payload, hash) \
           VALUES (25, 'x', 'other', 1, 'note.added', 1, 0, '{}', zeroblob(32));",
    )?;
    drop(conn);
    let dbs = db.to_string_lossy().into_owned();
    let (code, out, _) = correx(&["log", "verify", &dbs])?;
    assert_eq!(code, 1);
    let breaks: Vec<&str> = out.lines().filter(|l| l.contains("chain breaks")).collect();
    assert_eq!(breaks.len(), 1, "{out}");
    assert!(breaks[0].starts_with("position 25:"), "{out}");
    assert!(
        breaks[0].contains("after it 27 more events no longer link (to position 52"),
        "{out}"
    );
    let (_, all, _) = correx(&["log", "verify", &dbs, "--all"])?;
    assert_eq!(
        all.lines().filter(|l| l.contains("chain breaks")).count(),
        28,
        "{all}"
    );
    Ok(())
}

const SECRET: &str = "hunter2-pasted-by-mistake";

/// Appends an event of session `s1` holding the secret; its position.
fn secret_event(store: &SqliteEventStore, n: u64) -> Result<u64, Box<dyn std::error::Error>> {
    let e = NewEvent::new(
        "note.step",
        1,
        json!({"session_id": "s1", "pasted": SECRET, "n": n}),
    );
    Ok(store
        .append("session-s1", ExpectedVersion::Any, &[e])?
        .first_position)
}

fn holds_secret(db: &Path) -> bool {
    ["", "-wal"].iter().any(|suffix| {
        std::fs::read(format!("{}{suffix}", db.display()))
            .map(|b| b.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()))
            .unwrap_or(false)
    })
}

#[test]
fn a_log_erased_at_three_positions_still_verifies_and_a_payload_put_back_is_found() -> TestResult {
    use correx::{verify_log_sealed, EraseError};
    let tmp = TempDir::new("erase");
    let dir = tmp.path();
    let db = dir.join("events.db");
    write_log(&db)?;
    let store = SqliteEventStore::open(&db)?;
    let mut secrets = Vec::new();
    for n in 0..3 {
        secrets.push(secret_event(&store, n)?);
        store.append(
            "notes",
            ExpectedVersion::Any,
            &[NewEvent::new("note.added", 1, json!({}))],
        )?;
    }
    let seals = vec![store.seal()?];
    let signing = key(dir, "k")?;
    let checkpoint = correx::evidence::checkpoint_of_log(&db)?;
    let before = export_session(&db, "s1", &signing)?;
    for &p in &secrets {
        let done = store.erase(p, "a secret pasted into a prompt", Some("ops@example"))?;
        assert_eq!(done.position, p);
    }
    assert!(
        !holds_secret(&db),
        "the secret's bytes are still in the file or its WAL"
    );
    // The log, its seal made before, and its checkpoint made before all verify.
    let report = verify_log_sealed(&db, &seals)?;
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    assert_eq!(report.erased, secrets);
    assert!(
        correx::evidence::check_checkpoints(&db, std::slice::from_ref(&checkpoint))?.is_empty()
    );
    // The session's bundle proves the erased events by their digests.
    let after = export_session(&db, "s1", &signing)?;
    let r = verify_bundle(&after, &signing.public(), None)?;
    assert_eq!(r.erased, secrets);
    assert_eq!(r.events, events(&before).len());
    assert!(!after.to_string().contains(SECRET));
    // A digest changed in the bundle, or the payload put back beside it, is refused.
    let ev = events(&after);
    let i = ev.iter().position(|e| e["payload"].is_null()).unwrap_or(0);
    let mut changed = ev.clone();
    changed[i]["payload_digest"] = json!("33".repeat(32));
    assert!(verify_bundle(&with_events(&after, changed), &signing.public(), None).is_err());
    // What cannot be erased says why.
    let record = store.last_position()?;
    for (p, reason, want) in [
        (secrets[0], "again", "AlreadyErased"),
        (record, "the record", "ErasureRecord"),
        (99_999, "none", "NotFound"),
        (1, " ", "NoReason"),
    ] {
        let got = format!("{:?}", store.erase(p, reason, None).err());
        assert!(got.contains(want), "erase {p}: want {want}, got {got}");
    }
    drop(store);
    // The payload put back over its tombstone is found; so is it with its erasure undone.
    let conn = rusqlite::Connection::open(&db)?;
    let original = events(&before)
        .into_iter()
        .find(|e| e["position"] == json!(secrets[1]))
        .and_then(|e| e["payload"].as_str().map(str::to_owned))
        .ok_or("the secret event in the bundle made before")?;
    conn.execute(
        "UPDATE events SET payload = ?1 WHERE position = ?2",
        rusqlite::params![original, secrets[1] as i64],
    )?;
    let found = verify_log_sealed(&db, &seals)?.problems;
    assert!(
        found
            .iter()
            .any(|p| p.position == Some(secrets[1]) && p.detail.contains("put back")),
        "{found:#?}"
    );
    conn.execute(
        "DELETE FROM correx_erased WHERE position = ?1",
        [secrets[1] as i64],
    )?;
    let found = verify_log_sealed(&db, &seals)?.problems;
    assert!(
        found
            .iter()
            .any(|p| p.position == Some(secrets[1]) && p.detail.contains("not in effect")),
        "{found:#?}"
    );
    // An event changed after it was appended is not erased (that would hide the change).
    conn.execute(
        "UPDATE events SET payload = '{\"session_id\":\"s1\",\"n\":7}' WHERE position = 1",
        [],
    )?;
    drop(conn);
    let store = SqliteEventStore::open(&db)?;
    assert!(matches!(
        store.erase(1, "hide it", None),
        Err(EraseError::Tampered { position: 1 })
    ));
    Ok(())
}

#[test]
fn a_chained_log_from_before_digests_keeps_every_old_seal_and_checkpoint_verifying() -> TestResult {
    use correx::chain::{Link, GENESIS};
    use correx::{verify_log_sealed, EraseError, SealKey};
    let tmp = TempDir::new("digest-upgrade");
    let dir = tmp.path();
    let db = dir.join("events.db");
    write_log(&db)?;
    // The log as the previous schema (2) wrote it: no digests, every hash over the bytes.
    let conn = rusqlite::Connection::open(&db)?;
    conn.execute_batch(
        "DROP TABLE correx_erased; ALTER TABLE correx_chain DROP COLUMN digest_from; \
         PRAGMA user_version = 2;",
    )?;
    let rows: Vec<(i64, Vec<u8>)> = {
        let mut st = conn.prepare(
            "SELECT position, event_id, stream_id, stream_version, type_id, schema_version, \
             timestamp_ms, correlation_id, causation_id, payload FROM events ORDER BY position",
        )?;
        let mut previous = GENESIS;
        let mapped = st.query_map([], |r| {
            previous = Link {
                position: r.get::<_, i64>(0)? as u64,
                event_id: &r.get::<_, String>(1)?,
                stream_id: &r.get::<_, String>(2)?,
                stream_version: r.get::<_, i64>(3)? as u64,
                type_id: &r.get::<_, String>(4)?,
                schema_version: r.get(5)?,
                timestamp_ms: r.get(6)?,
                correlation_id: r.get::<_, Option<String>>(7)?.as_deref(),
                causation_id: r.get::<_, Option<String>>(8)?.as_deref(),
                payload: &r.get::<_, String>(9)?,
            }
            .hash(&previous);
            Ok((r.get(0)?, previous.to_vec()))
        })?;
        mapped.collect::<Result<_, _>>()?
    };
    for (p, h) in &rows {
        conn.execute(
            "UPDATE events SET hash = ?1 WHERE position = ?2",
            rusqlite::params![h, p],
        )?;
    }
    drop(conn);
    let old_last = rows.len() as u64;
    let hmac = SealKey::new(b"k".to_vec(), &dir.join("k"))?;
    let hmac_seal = correx::Seal::parse_all(
        &correx::Seal::of_log(&db)?.to_line(Some(&hmac)),
        Some(&hmac),
    )?;
    let old_checkpoint = correx::evidence::checkpoint_of_log(&db)?;
    assert!(verify_log_sealed(&db, &hmac_seal)?.problems.is_empty());
    // This build opens it (migrating to digests from the next append) and appends.
    let store = SqliteEventStore::open(&db)?;
    let secret = secret_event(&store, 0)?;
    assert_eq!(secret, old_last + 1);
    let report = verify_log_sealed(&db, &hmac_seal)?;
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    assert!(
        correx::evidence::check_checkpoints(&db, std::slice::from_ref(&old_checkpoint))?.is_empty()
    );
    // An old event's hash covers its bytes: it cannot be erased; a new one can.
    assert!(matches!(
        store.erase(2, "old", None),
        Err(EraseError::PredatesDigests { position: 2, digest_from }) if digest_from == secret
    ));
    store.erase(secret, "pasted", None)?;
    let report = verify_log_sealed(&db, &hmac_seal)?;
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    assert_eq!(report.erased, vec![secret]);
    assert!(correx::evidence::check_checkpoints(&db, &[old_checkpoint])?.is_empty());
    // A bundle spanning both forms verifies.
    let signing = key(dir, "signing")?;
    let b = export_session(&db, "s1", &signing)?;
    assert_eq!(
        verify_bundle(&b, &signing.public(), None)?.erased,
        vec![secret]
    );
    Ok(())
}

#[test]
fn correx_log_erase_erases_a_payload_and_verify_reports_it_erased() -> TestResult {
    let tmp = TempDir::new("erase-cli");
    let db = tmp.path().join("events.db");
    write_log(&db)?;
    let store = SqliteEventStore::open(&db)?;
    let p = secret_event(&store, 0)?;
    drop(store);
    let (dbs, ps) = (db.to_string_lossy().into_owned(), p.to_string());
    let (code, out, err) = correx(&["log", "erase", &dbs, "--position", &ps])?;
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("--reason"), "{err}");
    let (code, out, err) = correx(&[
        "log",
        "erase",
        &dbs,
        "--position",
        &ps,
        "--reason",
        "pasted",
        "--by",
        "ops",
    ])?;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("position {p}")), "{out}");
    assert!(!holds_secret(&db));
    let (code, out, err) = correx(&["log", "verify", &dbs])?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 payload(s) erased"), "{out}");
    let (code, _, err) = correx(&["log", "erase", &dbs, "--position", &ps, "--reason", "again"])?;
    assert_eq!(code, 1);
    assert!(err.contains("erased already"), "{err}");
    Ok(())
}
