//! The log as evidence: the hash chain and seals against someone who can write the file.
//!
//! Each attack is what a person with write access to the log would do with `sqlite3`: change a
//! byte, delete, insert or reorder events, recompute the chain after an edit, cut the tail, put
//! back an older copy. `verify` must name the first position each one concerns. The battery runs
//! as this user and again as nobody; one attack is also run on a log written without the chain,
//! where it must go unseen (the protection removed, the test fails).

use crate::util::{become_nobody, child_test, is_child, TempDir};
use correx::chain::{ChainHash, Link};
use correx::{
    verify_log, verify_log_sealed, EventStore, ExpectedVersion, LogReport, NewEvent, Seal,
    SealError, SealKey, SqliteEventStore,
};
use rusqlite::{params, Connection};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A log of `n` events in three streams, appended from three threads at once (group commit
/// chains whole batches).
fn write_log(path: &Path, n: u64) -> Result<Arc<SqliteEventStore>, Box<dyn std::error::Error>> {
    let store = Arc::new(SqliteEventStore::open(path)?);
    append(&store, n)?;
    Ok(store)
}

fn append<S: correx::EventStore + ?Sized + 'static>(store: &Arc<S>, n: u64) -> TestResult {
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || -> Result<(), correx::EventStoreError> {
                for i in (t..n).step_by(3) {
                    let e = NewEvent::new("note.added", 1, json!({"n": i, "text": "event"}))
                        .with_correlation(format!("c{t}"));
                    store.append(&format!("notes-{t}"), ExpectedVersion::Any, &[e])?;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "an appender panicked")??;
    }
    Ok(())
}

/// The first position a problem names, and its text.
fn first_problem(report: &LogReport) -> Option<(u64, String)> {
    report
        .problems
        .iter()
        .find_map(|p| p.position.map(|pos| (pos, p.detail.clone())))
}

fn sql(db: &Path, statements: &str) -> TestResult {
    Connection::open(db)?.execute_batch(statements)?;
    Ok(())
}

/// What an attacker who knows the algorithm does after an edit: recompute every hash from
/// `from` on, so the chain holds again.
pub(crate) fn recompute_chain(db: &Path, from: u64) -> TestResult {
    let conn = Connection::open(db)?;
    // In the form each position takes (digested from `digest_from` on), as the writer hashes.
    let digest_from: u64 = conn
        .query_row("SELECT digest_from FROM correx_chain", [], |r| {
            r.get::<_, Option<i64>>(0)
        })
        .ok()
        .flatten()
        .map_or(u64::MAX, |p| p as u64);
    let previous: Vec<u8> = conn.query_row(
        "SELECT hash FROM events WHERE position = ?1",
        [from as i64 - 1],
        |r| r.get(0),
    )?;
    let mut previous = ChainHash::try_from(previous.as_slice())?;
    let hashes: Vec<(i64, ChainHash)> = conn
        .prepare(
            "SELECT position, event_id, stream_id, stream_version, type_id, schema_version, \
             timestamp_ms, correlation_id, causation_id, payload FROM events \
             WHERE position >= ?1 ORDER BY position",
        )?
        .query_map([from as i64], |r| {
            let position: i64 = r.get(0)?;
            previous = Link {
                position: position as u64,
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
            .hash_at(&previous, digest_from, None);
            Ok((position, previous))
        })?
        .collect::<Result<_, _>>()?;
    for (position, hash) in hashes {
        conn.execute(
            "UPDATE events SET hash = ?1 WHERE position = ?2",
            params![&hash[..], position],
        )?;
    }
    Ok(())
}

/// One attack: a fresh log of 20 events, sealed at 5, 15 and 20, then `attack`; `verify` must
/// name `want` first, with `says` in the text.
fn attack(
    dir: &Path,
    name: &str,
    attack: &dyn Fn(&Path) -> TestResult,
    with_seals: bool,
    want: u64,
    says: &str,
) -> TestResult {
    let db = dir.join(format!("{name}.db"));
    let store = Arc::new(SqliteEventStore::open(&db)?);
    let mut seals = Vec::new();
    for upto in [5, 15, 20] {
        let have = store.last_position()?;
        append(&store, upto - have)?;
        seals.push(store.seal()?);
    }
    drop(store);
    assert!(
        verify_log_sealed(&db, &seals)?.problems.is_empty(),
        "{name}: sound before"
    );
    attack(&db)?;
    let report = verify_log_sealed(&db, if with_seals { &seals } else { &[] })?;
    let first = first_problem(&report);
    assert!(
        matches!(&first, Some((p, text)) if *p == want && text.contains(says)),
        "{name}: want position {want} ({says:?}), got {:#?}",
        report.problems
    );
    Ok(())
}

fn battery() -> TestResult {
    let tmp = TempDir::new("evidence");
    let dir = tmp.path();
    // A changed byte in a payload, and in each kind of metadata.
    attack(
        dir,
        "payload",
        &|db| {
            sql(
                db,
                "UPDATE events SET payload = replace(payload, 'event', 'Event') WHERE position = 7",
            )
        },
        false,
        7,
        "hash chain breaks",
    )?;
    for (column, change) in [
        ("timestamp_ms", "timestamp_ms + 1"),
        ("correlation_id", "'c9'"),
        ("stream_id", "'notes-9'"),
        ("type_id", "'note.removed'"),
        ("causation_id", "''"),
    ] {
        attack(
            dir,
            column,
            &|db| {
                sql(
                    db,
                    &format!("UPDATE events SET {column} = {change} WHERE position = 11"),
                )
            },
            false,
            11,
            "hash chain breaks",
        )?;
    }
    // A deleted event: the chain breaks at the next one.
    attack(
        dir,
        "deleted",
        &|db| sql(db, "DELETE FROM events WHERE position = 9"),
        false,
        10,
        "deleted, inserted or moved",
    )?;
    // Two events swapped.
    attack(
        dir,
        "reordered",
        &|db| {
            sql(
                db,
                "UPDATE events SET position = -1 WHERE position = 13;
                 UPDATE events SET position = 13 WHERE position = 14;
                 UPDATE events SET position = 14 WHERE position = -1;",
            )
        },
        false,
        13,
        "hash chain breaks",
    )?;
    // An event inserted at 5 with a well-formed hash; the ones after it moved up by one.
    attack(
        dir,
        "inserted",
        &|db| {
            let conn = Connection::open(db)?;
            conn.execute_batch(
                "UPDATE events SET position = position + 1000 WHERE position >= 5;
                 UPDATE events SET position = position - 999 WHERE position >= 1000;",
            )?;
            let previous: Vec<u8> =
                conn.query_row("SELECT hash FROM events WHERE position = 4", [], |r| {
                    r.get(0)
                })?;
            let link = Link {
                position: 5,
                event_id: "forged",
                stream_id: "forged",
                stream_version: 1,
                type_id: "note.added",
                schema_version: 1,
                timestamp_ms: 1,
                correlation_id: None,
                causation_id: None,
                payload: "{}",
            };
            let hash = link.hash_at(&ChainHash::try_from(previous.as_slice())?, 1, None);
            conn.execute(
                "INSERT INTO events (position, event_id, stream_id, stream_version, type_id, \
                 schema_version, timestamp_ms, payload, hash) \
                 VALUES (5, 'forged', 'forged', 1, 'note.added', 1, 1, '{}', ?1)",
                [&hash[..]],
            )?;
            Ok(())
        },
        false,
        6,
        "deleted, inserted or moved",
    )?;
    // Every hash removed, then an edit: the log is not taken for one from before the chain.
    attack(
        dir,
        "stripped",
        &|db| {
            sql(
                db,
                "UPDATE events SET hash = NULL;
                 UPDATE events SET payload = replace(payload, 'event', 'Event') WHERE position = 7",
            )
        },
        false,
        1,
        "chain starts at position 1",
    )?;
    // A hash turned into text: named, and appends go on (chaining past it).
    attack(
        dir,
        "texthash",
        &|db| {
            sql(db, "UPDATE events SET hash = hex(hash) WHERE position = 20")?;
            let store = Arc::new(SqliteEventStore::open(db)?);
            append(&store, 3)
        },
        false,
        20,
        "text, not 32 bytes",
    )?;
    {
        let report = verify_log(&dir.join("texthash.db"))?;
        assert_eq!(report.problems.len(), 1, "{:#?}", report.problems);
        assert_eq!(report.events, 23);
    }
    // An edit whose author recomputed the chain after it: the chain holds, the seals do not.
    let rewrite = |db: &Path| {
        sql(
            db,
            "UPDATE events SET payload = replace(payload, 'event', 'Event') WHERE position = 7",
        )?;
        recompute_chain(db, 7)
    };
    {
        let db = dir.join("rewritten-alone.db");
        drop(write_log(&db, 20)?);
        rewrite(&db)?;
        assert!(
            verify_log(&db)?.problems.is_empty(),
            "a recomputed chain holds without a seal: that is what seals are for"
        );
    }
    attack(dir, "rewritten", &rewrite, true, 15, "positions 6 to 15")?;
    // The tail cut after the last seal.
    attack(
        dir,
        "cut",
        &|db| sql(db, "DELETE FROM events WHERE position > 17"),
        true,
        18,
        "cut off",
    )?;
    // The whole file put back to an older copy, then written on; and the WAL swapped.
    rollback(dir)?;
    wal_swapped(dir)?;
    // The protection removed: the same edit on a log written without the chain is not seen.
    {
        let db = dir.join("unchained.db");
        let store = Arc::new(SqliteEventStore::open_unchained_for_bench(&db)?);
        append(&store, 20)?;
        drop(store);
        sql(
            &db,
            "UPDATE events SET payload = replace(payload, 'event', 'Event') WHERE position = 7",
        )?;
        assert!(
            verify_log(&db)?.problems.is_empty(),
            "without the chain the edit is invisible: the battery's findings come from the chain"
        );
    }
    Ok(())
}

/// A backup taken at 10 events, the log grown to 20 and sealed, then the backup put back.
fn rollback(dir: &Path) -> TestResult {
    let db = dir.join("rollback.db");
    let old = dir.join("rollback-old.db");
    let store = write_log(&db, 10)?;
    let mut seals = vec![store.seal()?];
    Connection::open(&db)?.execute("VACUUM INTO ?1", [old.to_string_lossy()])?;
    append(&store, 10)?;
    seals.push(store.seal()?);
    drop(store);
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(PathBuf::from(format!("{}{suffix}", db.display())));
    }
    std::fs::rename(&old, &db)?;
    let report = verify_log_sealed(&db, &seals)?;
    let first = first_problem(&report);
    assert!(
        matches!(&first, Some((11, text)) if text.contains("older copy")),
        "rolled back: {:#?}",
        report.problems
    );
    // Written on past the seal: as long as the sealed log, but not the sealed log.
    let store = Arc::new(SqliteEventStore::open(&db)?);
    append(&store, 15)?;
    drop(store);
    let report = verify_log_sealed(&db, &seals)?;
    let first = first_problem(&report);
    assert!(
        matches!(&first, Some((20, text)) if text.contains("positions 11 to 20")),
        "rolled back and written on: {:#?}",
        report.problems
    );
    Ok(())
}

/// The database and its WAL copied while the log held 10 events, the log grown to 20 and
/// sealed, then the copies put back: SQLite replays the old WAL and the log is 10 events again.
fn wal_swapped(dir: &Path) -> TestResult {
    let db = dir.join("wal.db");
    let with = |suffix: &str, p: &Path| PathBuf::from(format!("{}{suffix}", p.display()));
    let old = dir.join("wal-old.db");
    let store = write_log(&db, 10)?;
    assert!(with("-wal", &db).exists(), "the commits are in the WAL");
    std::fs::copy(&db, &old)?;
    std::fs::copy(with("-wal", &db), with("-wal", &old))?;
    append(&store, 10)?;
    let seal = store.seal()?;
    drop(store);
    for suffix in ["", "-wal"] {
        let _ = std::fs::remove_file(with(suffix, &db));
        std::fs::rename(with(suffix, &old), with(suffix, &db))?;
    }
    let _ = std::fs::remove_file(with("-shm", &db));
    let report = verify_log_sealed(&db, &[seal])?;
    assert_eq!(report.events, 10, "the old WAL was replayed");
    let first = first_problem(&report);
    assert!(
        matches!(&first, Some((11, text)) if text.contains("older copy")),
        "WAL swapped: {:#?}",
        report.problems
    );
    Ok(())
}

#[test]
fn every_edit_of_the_log_is_named_at_its_first_position() -> TestResult {
    battery()
}

#[test]
fn every_edit_of_the_log_is_named_at_its_first_position_as_nobody() -> TestResult {
    // SAFETY: reading the effective uid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Already unprivileged: the test above is this one.
        return battery();
    }
    crate::util::assert_child_passes(
        &mut child_test("evidence::battery_as_nobody_child"),
        "battery passed",
        "the tamper battery as nobody",
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

#[test]
fn a_log_from_before_the_chain_is_chained_from_its_next_append() -> TestResult {
    let tmp = TempDir::new("evidence-legacy");
    let db = tmp.join("old.db");
    // The schema and rows a correx from before the chain wrote.
    sql(
        &db,
        "CREATE TABLE events (position INTEGER PRIMARY KEY, event_id TEXT NOT NULL UNIQUE,
            stream_id TEXT NOT NULL, stream_version INTEGER NOT NULL, type_id TEXT NOT NULL,
            schema_version INTEGER NOT NULL, timestamp_ms INTEGER NOT NULL,
            correlation_id TEXT, causation_id TEXT, payload TEXT NOT NULL,
            UNIQUE (stream_id, stream_version));
         INSERT INTO events VALUES (1, 'a', 's', 1, 'note.added', 1, 5, NULL, NULL, '{}');
         INSERT INTO events VALUES (2, 'b', 's', 2, 'note.added', 1, 6, NULL, NULL, '{}');",
    )?;
    let report = verify_log(&db)?;
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    assert_eq!((report.unchained, report.chained_from), (2, None));
    assert!(matches!(
        Seal::of_log(&db),
        Err(SealError::Unchained { position: 2 })
    ));
    let store = write_log(&db, 3)?;
    let seal = store.seal()?;
    drop(store);
    let report = verify_log_sealed(&db, &[seal])?;
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    assert_eq!((report.unchained, report.chained_from), (2, Some(3)));
    // An edit of an unchained event shows only against a seal made after it... and the first
    // chained event is bound to position 3 by its hash: a deleted unchained event shows.
    sql(&db, "DELETE FROM events WHERE position = 2")?;
    let first = first_problem(&verify_log(&db)?);
    assert!(matches!(first, Some((3, _))), "{first:?}");
    Ok(())
}

#[test]
fn an_append_by_a_correx_without_the_chain_is_named_and_a_newer_schema_is_refused() -> TestResult {
    let tmp = TempDir::new("evidence-schema");
    let db = tmp.join("e.db");
    drop(write_log(&db, 3)?);
    // An append without a hash, as a correx from before the chain would make.
    sql(
        &db,
        "INSERT INTO events (event_id, stream_id, stream_version, type_id, schema_version, \
         timestamp_ms, payload) VALUES ('x', 'old', 1, 'note.added', 1, 1, '{}')",
    )?;
    let store = write_log(&db, 2)?;
    let seal = store.seal()?;
    drop(store);
    let report = verify_log_sealed(&db, &[seal])?;
    assert_eq!(report.problems.len(), 1, "{:#?}", report.problems);
    let first = first_problem(&report);
    assert!(
        matches!(&first, Some((4, text)) if text.contains("no hash")),
        "{first:?}"
    );
    // The next hash covers it in passing: an edit of it breaks the chain after it.
    sql(
        &db,
        "UPDATE events SET payload = '{\"n\": 1}' WHERE position = 4",
    )?;
    let report = verify_log(&db)?;
    assert!(
        report.problems.iter().any(|p| p.position == Some(5)),
        "{:#?}",
        report.problems
    );
    sql(&db, "PRAGMA user_version = 99")?;
    let err = SqliteEventStore::open(&db)
        .expect_err("too new")
        .to_string();
    assert!(
        err.contains("version 99") && err.contains("newer correx"),
        "{err}"
    );
    Ok(())
}

#[test]
fn signed_seals_verify_only_with_their_key_and_unchanged() -> TestResult {
    let tmp = TempDir::new("evidence-keys");
    let db = tmp.join("e.db");
    let store = write_log(&db, 4)?;
    let key = SealKey::new(b"host secret".to_vec(), Path::new("key"))?;
    let other = SealKey::new(b"another".to_vec(), Path::new("other"))?;
    let seal = store.seal()?;
    let line = seal.to_line(Some(&key));
    let back = Seal::parse_all(&line, Some(&key))?;
    assert_eq!(
        (back[0].position, back[0].hash, back[0].signed),
        (4, seal.hash, true)
    );
    assert!(matches!(
        Seal::parse_all(&line, Some(&other)),
        Err(SealError::BadSignature { line: 1, .. })
    ));
    // A seal moved to another position keeps its signature, which no longer matches.
    let moved = line.replace("\"position\":4", "\"position\":3");
    assert_ne!(moved, line);
    assert!(matches!(
        Seal::parse_all(&format!("\n{moved}"), Some(&key)),
        Err(SealError::BadSignature { line: 2, .. })
    ));
    let unsigned = seal.to_line(None);
    assert!(matches!(
        Seal::parse_all(&unsigned, Some(&key)),
        Err(SealError::BadSignature { .. })
    ));
    for bad in [
        "[1, 2]",
        "{\"correx_seal\": 1}",
        "not json",
        "{\"correx_seal\": 2, \"position\": 1}",
    ] {
        assert!(
            matches!(
                Seal::parse_all(bad, None),
                Err(SealError::Malformed { line: 1, .. })
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        SealKey::new(Vec::new(), Path::new("empty")),
        Err(SealError::EmptyKey { .. })
    ));
    Ok(())
}

#[test]
fn a_runtime_seals_its_log_to_the_configured_file_up_to_its_last_event() -> TestResult {
    let tmp = TempDir::new("evidence-runtime");
    let db = tmp.join("events.db");
    let seals = tmp.join("log.seals");
    let key = tmp.join("seal.key");
    std::fs::write(&key, b"k3y\n")?;
    let config = correx::RuntimeConfig::from_json(&format!(
        r#"{{"v": 1, "event_log": {:?}, "sandbox_root": {:?},
            "seal": {{"file": {:?}, "interval_ms": 50, "key_file": {:?}}}}}"#,
        db,
        tmp.join("work"),
        seals,
        key
    ))?;
    {
        let rt = correx::Runtime::new(&config, Arc::new(correx::DenyAll))?;
        let store = rt.events().clone();
        append(&store, 30)?;
        std::thread::sleep(std::time::Duration::from_millis(200));
        append(&store, 30)?;
    }
    let last = SqliteEventStore::open(&db)?.last_position()?;
    let key = SealKey::from_file(&key)?;
    let written = Seal::read_file(&seals, Some(&key))?;
    assert!(written.len() >= 2, "{written:?}");
    assert_eq!(written.last().map(|s| s.position), Some(last));
    assert!(written.windows(2).all(|w| w[0].position < w[1].position));
    assert!(verify_log_sealed(&db, &written)?.problems.is_empty());
    for (json, field) in [
        (r#"{"file": "relative.seals"}"#, "seal.file"),
        (r#"{"key_file": "/k"}"#, "seal.key_file"),
        (r#"{"file": "/s", "interval_ms": 0}"#, "seal.interval_ms"),
        (r#"["/s"]"#, "seal"),
    ] {
        let e = correx::RuntimeConfig::from_json(&format!(
            r#"{{"v": 1, "event_log": "/e.db", "seal": {json}}}"#
        ))
        .expect_err(field)
        .to_string();
        assert!(e.contains(field), "{e}");
    }
    Ok(())
}

/// With `signing_key_file`, the runtime's seals are Ed25519 checkpoints: each verifies with the
/// public key alone and commits to every event up to its position, so an event changed later,
/// its chain recomputed by someone without the key, no longer matches the root.
#[test]
fn a_runtime_writes_signed_checkpoints_that_catch_a_recomputed_chain() -> TestResult {
    use correx::evidence::{check_checkpoints, Checkpoint, SigningKey};
    let tmp = TempDir::new("evidence-runtime-signed");
    let db = tmp.join("events.db");
    let seals = tmp.join("log.checkpoints");
    let key_path = tmp.join("log.ed25519");
    let key = SigningKey::generate(&key_path)?;
    let config = correx::RuntimeConfig::from_json(&format!(
        r#"{{"v": 1, "event_log": {:?}, "sandbox_root": {:?},
            "seal": {{"file": {:?}, "interval_ms": 50, "signing_key_file": {:?}}}}}"#,
        db,
        tmp.join("work"),
        seals,
        key_path
    ))?;
    {
        let rt = correx::Runtime::new(&config, Arc::new(correx::DenyAll))?;
        let store = rt.events().clone();
        append(&store, 30)?;
        std::thread::sleep(std::time::Duration::from_millis(200));
        append(&store, 30)?;
    }
    let last = SqliteEventStore::open(&db)?.last_position()?;
    let text = std::fs::read_to_string(&seals)?;
    let written = Checkpoint::parse_all(&text, &key.public())?;
    assert!(written.len() >= 2, "{text}");
    assert_eq!(written.last().map(|c| c.position), Some(last));
    assert!(written.windows(2).all(|w| w[0].position < w[1].position));
    assert!(check_checkpoints(&db, &written)?.is_empty());
    // Another key's public half refuses every line.
    let other = SigningKey::generate(&tmp.join("other.ed25519"))?;
    assert!(Checkpoint::parse_all(&text, &other.public()).is_err());
    // An event changed and every hash after it recomputed: the chain holds, the roots do not.
    sql(
        &db,
        "UPDATE events SET payload = '{\"n\": 0, \"text\": \"changed\"}' WHERE position = 5",
    )?;
    recompute_chain(&db, 5)?;
    assert!(
        verify_log(&db)?.problems.is_empty(),
        "the chain was recomputed"
    );
    assert!(!check_checkpoints(&db, &written)?.is_empty());
    for (json, field) in [
        (r#"{"signing_key_file": "/k"}"#, "seal.signing_key_file"),
        (
            r#"{"file": "/s", "key_file": "/a", "signing_key_file": "/b"}"#,
            "seal.signing_key_file",
        ),
        (
            r#"{"file": "/s", "signing_key_file": "k"}"#,
            "seal.signing_key_file",
        ),
    ] {
        let e = correx::RuntimeConfig::from_json(&format!(
            r#"{{"v": 1, "event_log": "/e.db", "seal": {json}}}"#
        ))
        .expect_err(field)
        .to_string();
        assert!(e.contains(field), "{e}");
    }
    Ok(())
}
