//! The event store's promises, each test run against every store: the SQLite file and, when a
//! test server is configured, a PostgreSQL database (see [`log_locations`]); then what only
//! the SQLite file has (its pragmas, WAL checkpoints, descriptors).

use crate::util::{child_test, is_child, log_locations, open_log, TempDir};
use correx::{
    DomainEvent, EventStore, EventStoreError, ExpectedVersion, NewEvent, SqliteEventStore,
    TokenUsage, UnloadReason,
};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Which store a location names, for assertion messages.
fn kind(loc: &str) -> &'static str {
    if loc.contains("://") {
        "postgres"
    } else {
        "sqlite"
    }
}

fn all_events(store: &dyn EventStore) -> Result<Vec<correx::RecordedEvent>, EventStoreError> {
    let mut out = Vec::new();
    let mut from = 1;
    loop {
        let page = store.read_all(from, 500)?;
        match page.last() {
            Some(last) => from = last.position + 1,
            None => return Ok(out),
        }
        out.extend(page);
    }
}

/// Every stream's versions run 1, 2, 3, ... in position order, with no gap; `what` names the
/// store in the failure.
fn assert_gapless(all: &[correx::RecordedEvent], what: &str) {
    let mut by_stream: HashMap<&str, Vec<u64>> = HashMap::new();
    for e in all {
        by_stream
            .entry(&e.stream_id)
            .or_default()
            .push(e.stream_version);
    }
    for (stream, versions) in by_stream {
        let want: Vec<u64> = (1..=versions.len() as u64).collect();
        assert_eq!(versions, want, "{what}: stream {stream} has gaps");
    }
}

fn every_domain_event() -> Vec<DomainEvent> {
    vec![
        DomainEvent::ModelLoaded {
            model_id: "gemma".into(),
            model_path: "/m/gemma.gguf".into(),
            port: Some(10000),
            pid: Some(42),
            load_ms: 1300,
            endpoints: vec![],
            endpoint_features: Vec::new(),
            isolation: None,
        },
        DomainEvent::ModelLoaded {
            model_id: "remote".into(),
            model_path: String::new(),
            port: None,
            pid: None,
            load_ms: 3,
            endpoints: vec!["http://10.0.0.5:8080".into()],
            endpoint_features: Vec::new(),
            isolation: None,
        },
        DomainEvent::ModelEndpointFailover {
            model_id: "remote".into(),
            from: "http://10.0.0.5:8080".into(),
            to: "http://10.0.0.6:8080".into(),
            error: "connection refused".into(),
        },
        DomainEvent::ModelUnloaded {
            model_id: "gemma".into(),
            reason: UnloadReason::Unresponsive,
            pid: Some(42),
            port: Some(10000),
        },
        DomainEvent::ToolExecutionInterrupted {
            session_id: "s".into(),
            invocation_id: "i".into(),
            tool_name: "file_write".into(),
            state: "completed".into(),
        },
        DomainEvent::ToolApprovalDecided {
            session_id: "s".into(),
            invocation_id: "i".into(),
            tool_name: "shell".into(),
            tier: 2,
            decision: "denied".into(),
            decided_by: "rule: shell [\"rm\"] forbid".into(),
            wait_ms: 0,
            reason: Some("forbidden".into()),
            answers_request: false,
            identity: None,
        },
        DomainEvent::ToolExecutionStarted {
            session_id: "s".into(),
            invocation_id: "i".into(),
            tool_name: "file_write".into(),
            tier: 2,
            isolation: None,
        },
        DomainEvent::ToolExecutionCompleted {
            session_id: "s".into(),
            invocation_id: "i".into(),
            tool_name: "file_write".into(),
            duration_ms: 3,
            network: Some(serde_json::json!({"connections": 1, "bytes_up": 80, "bytes_down": 512})),
        },
        DomainEvent::ToolNetworkDenied {
            session_id: "s".into(),
            invocation_id: "i".into(),
            tool_name: "shell".into(),
            host: "169.254.169.254".into(),
            port: 80,
            reason: "address_literal".into(),
        },
        DomainEvent::ToolExecutionFailed {
            session_id: "s".into(),
            invocation_id: "i".into(),
            tool_name: "file_write".into(),
            reason: "interrupted".into(),
            recoverable: false,
            kind: Some("io".into()),
            network: None,
        },
        DomainEvent::ToolExecutionRejected {
            session_id: "s".into(),
            invocation_id: "i".into(),
            tool_name: "shell".into(),
            tier: 2,
            reason: "denied".into(),
            kind: None,
        },
        DomainEvent::InferenceCompleted {
            model_id: "gemma".into(),
            usage: TokenUsage {
                prompt_tokens: 10,
                completion_tokens: 5,
                total_tokens: 15,
            },
            latency_ms: 80,
            finish_reason: "length".into(),
            endpoint: None,
        },
    ]
}

#[test]
fn every_domain_event_round_trips_through_the_file() -> TestResult {
    let dir = TempDir::new("roundtrip");
    let events = every_domain_event();
    for loc in log_locations(&dir, "roundtrip") {
        let what = kind(&loc);
        {
            let store = open_log(&loc)?;
            for e in &events {
                correx::append_domain(&*store, "mixed", e)?;
            }
        }
        // Reopen: what comes back was read from disk, not from a cache.
        let store = open_log(&loc)?;
        let back = store.read_stream("mixed", 1, 100)?;
        assert_eq!(back.len(), events.len(), "{what}");
        for (want, got) in events.iter().zip(&back) {
            assert_eq!(got.type_id, want.type_id(), "{what}");
            assert_eq!(got.domain()?.as_ref(), Some(want), "{what}");
        }
    }
    Ok(())
}

#[test]
fn versions_are_gapless_and_positions_strictly_increase_across_threads() -> TestResult {
    let dir = TempDir::new("gapless");
    for loc in log_locations(&dir, "gapless") {
        let what = kind(&loc);
        let store = open_log(&loc)?;
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || -> Result<(), EventStoreError> {
                    for i in 0..50 {
                        let stream = format!("stream-{}", (t + i) % 3);
                        let batch = vec![NewEvent::new("n", 1, json!({"t": t, "i": i})); 1 + i % 3]
                            .into_iter()
                            .map(|mut e| {
                                e.event_id = correx::EventId::random();
                                e
                            })
                            .collect::<Vec<_>>();
                        store.append(&stream, ExpectedVersion::Any, &batch)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for t in threads {
            t.join().map_err(|_| "thread panicked")??;
        }
        let all = all_events(&*store)?;
        assert_eq!(all.len(), 4 * (17 + 17 * 2 + 16 * 3), "{what}");
        for pair in all.windows(2) {
            assert!(
                pair[0].position < pair[1].position,
                "{what}: {} then {}",
                pair[0].position,
                pair[1].position
            );
        }
        assert_gapless(&all, what);
        assert_eq!(
            store.last_position()?,
            all.last().map(|e| e.position).unwrap_or(0),
            "{what}"
        );
    }
    Ok(())
}

#[test]
fn batch_appends_are_atomic_and_expected_version_is_checked() -> TestResult {
    let dir = TempDir::new("expected");
    for loc in log_locations(&dir, "expected") {
        let what = kind(&loc);
        let store = open_log(&loc)?;
        let r = store.append(
            "s",
            ExpectedVersion::NoStream,
            &[NewEvent::new("a", 1, json!(1))],
        )?;
        assert_eq!(r.stream_version, 1, "{what}");
        let err = store
            .append(
                "s",
                ExpectedVersion::NoStream,
                &[NewEvent::new("a", 1, json!(2))],
            )
            .unwrap_err();
        assert!(
            matches!(
                err,
                EventStoreError::WrongExpectedVersion {
                    actual: Some(1),
                    expected: None,
                    ..
                }
            ),
            "{what}: {err}"
        );
        let err = store
            .append(
                "s",
                ExpectedVersion::Exact(5),
                &[NewEvent::new("a", 1, json!(2))],
            )
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("expected version 5 but holds version 1"),
            "{what}: {err}"
        );
        let batch = [
            NewEvent::new("a", 1, json!(2)),
            NewEvent::new("a", 1, json!(3)),
        ];
        let r = store.append("s", ExpectedVersion::Exact(1), &batch)?;
        assert_eq!(
            (r.stream_version, r.last_position - r.first_position),
            (3, 1),
            "{what}"
        );
        // A batch that repeats an id inside itself fails whole: nothing of it is stored.
        let dup = NewEvent::new("a", 1, json!(4));
        let err = store
            .append("s", ExpectedVersion::Any, &[dup.clone(), dup])
            .unwrap_err();
        assert!(
            matches!(err, EventStoreError::IdempotencyConflict { .. }),
            "{what}: {err}"
        );
        assert_eq!(store.read_stream("s", 1, 100)?.len(), 3, "{what}");
        let empty = store.append("s", ExpectedVersion::Any, &[]);
        assert!(
            matches!(empty, Err(EventStoreError::InvalidAppend { .. })),
            "{what}: {empty:?}"
        );
        // An event must say what happened: an empty type id fails the whole batch.
        let err = store
            .append(
                "s",
                ExpectedVersion::Any,
                &[
                    NewEvent::new("ok", 1, json!(1)),
                    NewEvent::new(" ", 1, json!(2)),
                ],
            )
            .unwrap_err();
        assert!(err.to_string().contains("empty type_id"), "{what}: {err}");
        assert_eq!(store.read_stream("s", 1, 100)?.len(), 3, "{what}");
    }
    Ok(())
}

#[test]
fn appending_an_event_id_twice_stores_it_once() -> TestResult {
    let dir = TempDir::new("idem");
    for loc in log_locations(&dir, "idem") {
        let what = kind(&loc);
        let store = open_log(&loc)?;
        let batch = [
            NewEvent::new("a", 1, json!(1)),
            NewEvent::new("a", 1, json!(2)),
        ];
        let first = store.append("s", ExpectedVersion::NoStream, &batch)?;
        // The retry of an append whose answer was lost: same ids, same stream.
        let retry = store.append("s", ExpectedVersion::NoStream, &batch)?;
        assert_eq!(first, retry, "{what}");
        assert_eq!(store.read_stream("s", 1, 10)?.len(), 2, "{what}");
        let err = store
            .append("other", ExpectedVersion::Any, &batch)
            .unwrap_err();
        assert!(
            matches!(err, EventStoreError::IdempotencyConflict { .. }),
            "{what}: {err}"
        );
        // The same id with other content is not a retry: refused, and the first content stays.
        let mut changed = batch.clone();
        changed[1].payload = json!(3);
        let err = store
            .append("s", ExpectedVersion::Any, &changed)
            .unwrap_err();
        assert!(
            matches!(&err, EventStoreError::IdempotencyConflict { detail, .. } if detail.contains("payload")),
            "{what}: {err}"
        );
        let mut retyped = batch.clone();
        retyped[0].type_id = "b".into();
        let err = store
            .append("s", ExpectedVersion::Any, &retyped)
            .unwrap_err();
        assert!(err.to_string().contains("type_id"), "{what}: {err}");
        let stored = store.read_stream("s", 1, 10)?;
        assert_eq!((stored.len(), &stored[1].payload), (2, &json!(2)), "{what}");
        // Content equal as JSON is the same content (key order is not content).
        let keyed = [NewEvent::new("k", 1, json!({"a": 1, "b": [1, 2]}))];
        let first = store.append("k", ExpectedVersion::Any, &keyed)?;
        let mut reordered = keyed.clone();
        reordered[0].payload = serde_json::from_str(r#"{"b": [1, 2], "a": 1}"#)?;
        assert_eq!(
            store.append("k", ExpectedVersion::Any, &reordered)?,
            first,
            "{what}"
        );
    }
    Ok(())
}

#[test]
fn two_threads_racing_one_expected_version_exactly_one_wins() -> TestResult {
    let dir = TempDir::new("race");
    for loc in log_locations(&dir, "race") {
        let what = kind(&loc);
        let store = open_log(&loc)?;
        store.append(
            "s",
            ExpectedVersion::NoStream,
            &[NewEvent::new("a", 1, json!(0))],
        )?;
        for round in 1..=20u64 {
            let barrier = Arc::new(std::sync::Barrier::new(2));
            let handles: Vec<_> = (0..2)
                .map(|t| {
                    let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
                    std::thread::spawn(move || {
                        barrier.wait();
                        store.append(
                            "s",
                            ExpectedVersion::Exact(round),
                            &[NewEvent::new("a", 1, json!({"round": round, "t": t}))],
                        )
                    })
                })
                .collect();
            let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
            let mut wins = 0;
            for r in results {
                match r.map_err(|_| "thread panicked")? {
                    Ok(_) => wins += 1,
                    Err(EventStoreError::WrongExpectedVersion { actual, .. }) => {
                        assert_eq!(actual, Some(round + 1), "{what}: round {round}")
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            assert_eq!(wins, 1, "{what}: round {round}");
        }
        assert_eq!(store.read_stream("s", 1, 100)?.len(), 21, "{what}");
    }
    Ok(())
}

#[test]
fn a_conflicting_append_in_a_group_fails_alone() -> TestResult {
    let dir = TempDir::new("group");
    for loc in log_locations(&dir, "group") {
        let what = kind(&loc);
        let store = open_log(&loc)?;
        // Many threads at once make groups; half of them expect a version that cannot hold.
        let handles: Vec<_> = (0..16)
            .map(|t| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    let expected = if t % 2 == 0 {
                        ExpectedVersion::Any
                    } else {
                        ExpectedVersion::Exact(1_000_000)
                    };
                    let mut outcomes = Vec::new();
                    for i in 0..20 {
                        outcomes.push(store.append(
                            &format!("g{}", t % 4),
                            expected,
                            &[NewEvent::new("a", 1, json!({"t": t, "i": i}))],
                        ));
                    }
                    (t, outcomes)
                })
            })
            .collect();
        for h in handles {
            let (t, outcomes) = h.join().map_err(|_| "thread panicked")?;
            for o in outcomes {
                if t % 2 == 0 {
                    o?;
                } else {
                    assert!(
                        matches!(o, Err(EventStoreError::WrongExpectedVersion { .. })),
                        "{what}: {o:?}"
                    );
                }
            }
        }
        assert_eq!(all_events(&*store)?.len(), 8 * 20, "{what}");
    }
    Ok(())
}

#[test]
fn two_handles_on_one_file_see_each_others_stream_versions() -> TestResult {
    // Each handle's writer remembers the versions it wrote; a commit by the other handle must
    // make it look again, or it would hand out a version the other already used.
    let dir = TempDir::new("handles");
    for loc in log_locations(&dir, "handles") {
        let what = kind(&loc);
        let a = open_log(&loc)?;
        let b = open_log(&loc)?;
        let mut version = 0;
        for i in 0..20u64 {
            let store = if i % 3 == 0 { &b } else { &a };
            let expected = if i % 2 == 0 {
                ExpectedVersion::Exact(version)
            } else {
                ExpectedVersion::Any
            };
            let expected = if version == 0 {
                ExpectedVersion::NoStream
            } else {
                expected
            };
            let r = store.append("shared", expected, &[NewEvent::new("a", 1, json!(i))])?;
            version += 1;
            assert_eq!(r.stream_version, version, "{what}: append {i}");
            // The other handle's idea of the stream is stale now: a stale exact version fails.
            let other = if i % 3 == 0 { &a } else { &b };
            let err = other
                .append(
                    "shared",
                    ExpectedVersion::Exact(version - 1),
                    &[NewEvent::new("a", 1, json!("stale"))],
                )
                .unwrap_err();
            assert!(
                matches!(err, EventStoreError::WrongExpectedVersion { actual: Some(v), .. } if v == version),
                "{what}: {err}"
            );
        }
        let all = all_events(&*a)?;
        assert_eq!(all.len(), 20, "{what}");
        assert_gapless(&all, what);
    }
    Ok(())
}

#[test]
fn a_batch_repeating_a_stored_id_fails_alone_and_leaves_nothing_in_its_group() -> TestResult {
    let dir = TempDir::new("partial");
    for loc in log_locations(&dir, "partial") {
        let what = kind(&loc);
        let store = open_log(&loc)?;
        let seed = NewEvent::new("a", 1, json!("seed"));
        store.append(
            "seed",
            ExpectedVersion::NoStream,
            std::slice::from_ref(&seed),
        )?;
        // Threads append at once, so batches share groups; odd threads' batches end with the
        // stored id, which makes the whole batch a conflict: its fresh first event must not stay.
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let store = Arc::clone(&store);
                let seed = seed.clone();
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    for i in 0..20 {
                        let fresh = NewEvent::new("a", 1, json!({"t": t, "i": i}));
                        let second = if t % 2 == 1 {
                            seed.clone()
                        } else {
                            NewEvent::new("a", 1, json!({"t": t, "i": i, "second": true}))
                        };
                        let id = fresh.event_id.to_string();
                        let r =
                            store.append(&format!("p{t}"), ExpectedVersion::Any, &[fresh, second]);
                        out.push((id, r));
                    }
                    (t, out)
                })
            })
            .collect();
        let mut refused = HashSet::new();
        for h in handles {
            let (t, out) = h.join().map_err(|_| "thread panicked")?;
            for (id, r) in out {
                if t % 2 == 1 {
                    assert!(
                        matches!(r, Err(EventStoreError::IdempotencyConflict { .. })),
                        "{what}: {r:?}"
                    );
                    refused.insert(id);
                } else {
                    r?;
                }
            }
        }
        let all = all_events(&*store)?;
        assert_eq!(all.len(), 1 + 4 * 20 * 2, "{what}");
        assert!(
            all.iter()
                .all(|e| !refused.contains(&e.event_id.to_string())),
            "{what}: a refused batch's event was stored"
        );
        assert_gapless(&all, what);
    }
    Ok(())
}

#[test]
fn unknown_type_reads_raw_and_a_corrupt_row_names_its_position() -> TestResult {
    let dir = TempDir::new("corrupt");
    let path = dir.join("e.db");
    let store = SqliteEventStore::open(&path)?;
    store.append(
        "s",
        ExpectedVersion::Any,
        &[NewEvent::new("future.thing", 3, json!({"x": 1}))],
    )?;
    let bad_shape = NewEvent::new("model.unloaded", 1, json!({"model_id": 5}));
    store.append("s", ExpectedVersion::Any, &[bad_shape])?;
    store.append(
        "s",
        ExpectedVersion::Any,
        &[NewEvent::new("n", 1, json!(null))],
    )?;
    let all = all_events(&store)?;
    assert_eq!(all[0].domain()?, None);
    assert_eq!(all[0].payload["x"], 1);
    match all[1].domain() {
        Err(EventStoreError::CorruptEvent { position, .. }) => assert_eq!(position, 2),
        other => panic!("expected a corrupt event, got {other:?}"),
    }
    // Damage the third row behind the store's back.
    let raw = rusqlite::Connection::open(&path)?;
    raw.execute(
        "UPDATE events SET payload = '{not json' WHERE position = 3",
        [],
    )?;
    match store.read_all(1, 10) {
        Err(e @ EventStoreError::CorruptEvent { position: 3, .. }) => {
            assert!(e.to_string().contains("position 3"))
        }
        other => panic!("expected a corrupt row error, got {other:?}"),
    }
    Ok(())
}

#[test]
fn store_commits_with_synchronous_full_in_wal_mode() -> TestResult {
    let dir = TempDir::new("pragmas");
    let path = dir.join("e.db");
    let store = SqliteEventStore::open(&path)?;
    assert_eq!(store.durability(), correx::Durability::Full);
    store.append(
        "s",
        ExpectedVersion::Any,
        &[NewEvent::new("a", 1, json!(1))],
    )?;
    let raw = rusqlite::Connection::open(&path)?;
    let mode: String = raw.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    assert_eq!(mode, "wal");
    Ok(())
}

#[test]
fn open_fails_clearly_when_the_directory_is_missing() {
    let err = SqliteEventStore::open("/nonexistent-correx-dir/x/events.db").unwrap_err();
    assert!(matches!(err, EventStoreError::Open { .. }));
    assert!(
        err.to_string()
            .contains("/nonexistent-correx-dir/x/events.db"),
        "{err}"
    );
}

/// Helper run in a child process: appends from 4 threads, then exits.
#[test]
#[ignore = "helper: run by multi_process_appends_are_each_stored_once"]
fn child_append_worker() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    let loc = std::env::var("CORREX_CHILD_DB")?;
    let tag = std::env::var("CORREX_CHILD_TAG")?;
    let store = open_log(&loc)?;
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let (store, tag) = (Arc::clone(&store), tag.clone());
            std::thread::spawn(move || -> Result<(), EventStoreError> {
                for i in 0..250 {
                    let mut e = NewEvent::new("w", 1, json!({}));
                    e.event_id = correx::EventId::from_string(format!("{tag}-{t}-{i}"));
                    store.append(&format!("s{}", i % 5), ExpectedVersion::Any, &[e])?;
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "thread panicked")??;
    }
    Ok(())
}

/// Starts one `child_append_worker` process per tag, each appending 1,000 events to the log
/// at `loc` (a path or a URL).
fn spawn_append_workers(loc: &str, tags: &[&str]) -> std::io::Result<Vec<std::process::Child>> {
    tags.iter()
        .map(|tag| {
            child_test("events::child_append_worker")
                .env("CORREX_CHILD_DB", loc)
                .env("CORREX_CHILD_TAG", tag)
                .stdout(Stdio::null())
                .spawn()
        })
        .collect()
}

#[test]
fn multi_process_appends_are_each_stored_once() -> TestResult {
    let dir = TempDir::new("multiproc");
    for loc in log_locations(&dir, "multiproc") {
        let what = kind(&loc);
        drop(open_log(&loc)?);
        let children = spawn_append_workers(&loc, &["a", "b"])?;
        for mut c in children {
            assert!(c.wait()?.success(), "{what}: a child failed to append");
        }
        let store = open_log(&loc)?;
        let all = all_events(&*store)?;
        let ids: HashSet<String> = all.iter().map(|e| e.event_id.to_string()).collect();
        assert_eq!(all.len(), 2000, "{what}");
        assert_eq!(ids.len(), 2000, "{what}");
        for tag in ["a", "b"] {
            for t in 0..4 {
                for i in 0..250 {
                    assert!(
                        ids.contains(&format!("{tag}-{t}-{i}")),
                        "{what}: {tag}-{t}-{i} missing"
                    );
                }
            }
        }
    }
    Ok(())
}

/// Helper run in a child process: appends forever, printing each id after its commit.
#[test]
#[ignore = "helper: run by a_sigkill_loses_no_acknowledged_append"]
fn child_append_until_killed() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    use std::io::Write;
    let store = open_log(&std::env::var("CORREX_CHILD_DB")?)?;
    // Several threads so that the kill lands during group commits too.
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || -> Result<(), EventStoreError> {
                for i in 0.. {
                    let e = NewEvent::new("tick", 1, json!({"t": t, "i": i}));
                    store.append(
                        &format!("c{t}"),
                        ExpectedVersion::Any,
                        std::slice::from_ref(&e),
                    )?;
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "{}", e.event_id);
                    let _ = out.flush();
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "thread panicked")??;
    }
    Ok(())
}

#[test]
fn a_sigkill_loses_no_acknowledged_append() -> TestResult {
    let dir = TempDir::new("sigkill");
    for loc in log_locations(&dir, "sigkill") {
        let what = kind(&loc);
        let mut child = child_test("events::child_append_until_killed")
            .env("CORREX_CHILD_DB", &loc)
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut acknowledged = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            if line.len() == 36 {
                acknowledged.push(line);
            }
            if acknowledged.len() == 300 {
                // SAFETY: plain kill(2) on our own child's pid.
                unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
                break;
            }
        }
        child.wait()?;
        assert_eq!(
            acknowledged.len(),
            300,
            "{what}: the child stopped appending early"
        );
        let store = open_log(&loc)?;
        let all = all_events(&*store)?;
        let stored: HashSet<String> = all.iter().map(|e| e.event_id.to_string()).collect();
        for id in &acknowledged {
            assert!(
                stored.contains(id),
                "{what}: acknowledged event {id} was lost"
            );
        }
        assert_gapless(&all, what);
        if let Some(sqlite) = store.as_sqlite() {
            let raw = rusqlite::Connection::open(sqlite.path())?;
            let check: String = raw.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
            assert_eq!(check, "ok");
        }
    }
    Ok(())
}

#[test]
fn eight_threads_of_a_thousand_durable_appends_are_all_stored_once_and_gapless() -> TestResult {
    let dir = TempDir::new("eight-k");
    for loc in log_locations(&dir, "eight-k") {
        let what = kind(&loc);
        let store = open_log(&loc)?;
        // The file store chooses its own durability; a PostgreSQL commit's is the server's
        // settings (fsync, synchronous_commit), which the store does not set.
        if let Some(sqlite) = store.as_sqlite() {
            assert_eq!(sqlite.durability(), correx::Durability::Full);
        }
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || -> Result<(), EventStoreError> {
                    for i in 0..1000 {
                        let mut e = NewEvent::new("tick", 1, json!({"t": t, "i": i}));
                        e.event_id = correx::EventId::from_string(format!("{t}-{i}"));
                        store.append(
                            &format!("mixed-{}", (t + i) % 5),
                            ExpectedVersion::Any,
                            &[e],
                        )?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "thread panicked")??;
        }
        let all = all_events(&*store)?;
        assert_eq!(all.len(), 8000, "{what}");
        let ids: HashSet<String> = all.iter().map(|e| e.event_id.to_string()).collect();
        assert_eq!(ids.len(), 8000, "{what}");
        assert_gapless(&all, what);
    }
    Ok(())
}

#[test]
fn a_subscription_catches_up_then_follows_live_appends_in_order() -> TestResult {
    let dir = TempDir::new("sub");
    for loc in log_locations(&dir, "sub") {
        let what = kind(&loc);
        let store = open_log(&loc)?;
        for i in 0..700 {
            store.append(
                "h",
                ExpectedVersion::Any,
                &[NewEvent::new("old", 1, json!(i))],
            )?;
        }
        let mut sub = store.subscribe(0)?;
        let writer = {
            let store = Arc::clone(&store);
            std::thread::spawn(move || -> Result<(), EventStoreError> {
                for i in 0..300 {
                    store.append(
                        "live",
                        ExpectedVersion::Any,
                        &[NewEvent::new("new", 1, json!(i))],
                    )?;
                }
                Ok(())
            })
        };
        let mut seen = Vec::new();
        while seen.len() < 1000 {
            match sub.next_timeout(Duration::from_secs(10))? {
                Some(e) => seen.push(e.position),
                None => return Err(format!("{what}: stalled after {} events", seen.len()).into()),
            }
        }
        writer.join().map_err(|_| "writer panicked")??;
        assert_eq!(seen, (1..=1000).collect::<Vec<u64>>(), "{what}");
        assert_eq!(sub.next_timeout(Duration::from_millis(50))?, None, "{what}");
        // Resume from a saved position: only what came after it.
        let mut resumed = store.subscribe(990)?;
        assert_eq!(
            resumed
                .next_timeout(Duration::from_secs(1))?
                .map(|e| e.position),
            Some(991),
            "{what}"
        );
    }
    Ok(())
}

/// Helper run in a child process: subscribes after CORREX_CHILD_FROM and prints each
/// delivered position and id until it has printed CORREX_CHILD_COUNT of them.
#[test]
#[ignore = "helper: run by two_appending_processes_and_a_restarted_subscriber_see_everything_once"]
fn child_subscriber() -> TestResult {
    if !is_child() {
        return Ok(());
    }
    use std::io::Write;
    let store = open_log(&std::env::var("CORREX_CHILD_DB")?)?;
    let from: u64 = std::env::var("CORREX_CHILD_FROM")?.parse()?;
    let count: usize = std::env::var("CORREX_CHILD_COUNT")?.parse()?;
    let mut sub = store.subscribe(from)?;
    let mut out = std::io::stdout().lock();
    for _ in 0..count {
        let e = sub
            .next_timeout(Duration::from_secs(30))?
            .ok_or("no event in 30 s")?;
        writeln!(out, "EVENT {} {}", e.position, e.event_id)?;
    }
    out.flush()?;
    Ok(())
}

fn subscriber_run(
    loc: &str,
    from: u64,
    count: usize,
) -> Result<Vec<(u64, String)>, Box<dyn std::error::Error>> {
    let out = child_test("events::child_subscriber")
        .env("CORREX_CHILD_DB", loc)
        .env("CORREX_CHILD_FROM", from.to_string())
        .env("CORREX_CHILD_COUNT", count.to_string())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: subscriber failed: {text}{}",
        kind(loc),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(text
        .split("EVENT ")
        .skip(1)
        .filter_map(|chunk| {
            let mut parts = chunk.split_whitespace();
            Some((parts.next()?.parse().ok()?, parts.next()?.to_owned()))
        })
        .collect())
}

#[test]
fn two_appending_processes_and_a_restarted_subscriber_see_everything_once() -> TestResult {
    let dir = TempDir::new("sub-procs");
    for loc in log_locations(&dir, "sub-procs") {
        let what = kind(&loc);
        drop(open_log(&loc)?);
        let writers = spawn_append_workers(&loc, &["p", "q"])?;
        // The subscriber stops half-way, saving its position, and a new one resumes from it while
        // the writers are still going.
        let first = subscriber_run(&loc, 0, 1000)?;
        let saved = first.last().map(|(p, _)| *p).ok_or("nothing delivered")?;
        let second = subscriber_run(&loc, saved, 1000)?;
        for mut w in writers {
            assert!(w.wait()?.success(), "{what}: a writer failed");
        }
        let all: Vec<(u64, String)> = first.into_iter().chain(second).collect();
        assert_eq!(all.len(), 2000, "{what}");
        for pair in all.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{what}: out of order: {pair:?}");
        }
        let ids: HashSet<&str> = all.iter().map(|(_, id)| id.as_str()).collect();
        assert_eq!(
            ids.len(),
            2000,
            "{what}: an event was delivered twice or missed"
        );
    }
    Ok(())
}

#[test]
fn an_unload_recorded_before_pid_and_port_still_reads() {
    let old: Result<DomainEvent, _> = serde_json::from_value(json!({
        "type": "model.unloaded",
        "data": {"model_id": "gemma", "reason": "idle"}
    }));
    assert!(
        matches!(
            old,
            Ok(DomainEvent::ModelUnloaded {
                pid: None,
                port: None,
                ..
            })
        ),
        "{old:?}"
    );
}

#[test]
fn checkpoints_keep_the_wal_bounded_in_both_modes() -> TestResult {
    for mode in [
        correx::Checkpoints::Background,
        correx::Checkpoints::InCommit,
    ] {
        let tmp = TempDir::new("wal");
        let path = tmp.join("events.db");
        let options = correx::StoreOptions {
            checkpoints: mode,
            ..correx::StoreOptions::default()
        };
        let store = Arc::new(SqliteEventStore::open_with(&path, options)?);
        // 4 threads x 1500 appends of ~1 KiB write about 15,000 WAL frames (60 MB) when nothing
        // checkpoints; SQLite's threshold is 1000 pages, the inline fallback 8000.
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || -> Result<(), EventStoreError> {
                    for i in 0..1500 {
                        let e =
                            NewEvent::new("bench.e", 1, json!({"i": i, "pad": "x".repeat(1000)}));
                        store.append(&format!("s{t}"), ExpectedVersion::Any, &[e])?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "appender panicked")??;
        }
        let wal = std::fs::metadata(tmp.join("events.db-wal"))?.len();
        let db = std::fs::metadata(&path)?.len();
        assert!(wal < 9000 * 4096, "{mode:?}: the WAL grew to {wal} bytes");
        assert!(
            db > 4 << 20,
            "{mode:?}: nothing was checkpointed ({db} bytes)"
        );
        assert_eq!(store.last_position()?, 6000);
        assert_gapless(&all_events(&*store)?, &format!("{mode:?}"));
    }
    Ok(())
}

/// Subscriptions freed give back what they held: the log's descriptors return to what they
/// were (SQLite used to keep each freed subscription's file open until the store closed).
#[test]
fn freed_subscriptions_give_back_their_descriptors() -> TestResult {
    let dir = TempDir::new("sub-fds");
    let path = dir.join("events.db");
    let store = Arc::new(SqliteEventStore::open(&path)?);
    store.append(
        "s",
        ExpectedVersion::Any,
        &[NewEvent::new("a", 1, json!(1))],
    )?;
    let open_on = |p: &std::path::Path| -> usize {
        std::fs::read_dir("/proc/self/fd")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == p))
            .count()
    };
    let before = open_on(&path);
    let mut subs = Vec::new();
    for _ in 0..100 {
        let mut s = store.subscribe(0)?;
        assert!(s.next_timeout(Duration::ZERO)?.is_some());
        subs.push(s);
    }
    drop(subs);
    let after = open_on(&path);
    assert!(
        after <= before + 2,
        "{before} descriptors before, {after} after 100 freed subscriptions"
    );
    Ok(())
}
