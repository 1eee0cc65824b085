//! `cargo bench --bench event_store`: correx's event store against a raw rusqlite loop doing the
//! same inserts with the same pragmas and durability, on the same temp filesystem, in one run;
//! then the PostgreSQL store against a bare client on the test server (`common/pg.rs`).

use correx::{Checkpoints, EventStore, ExpectedVersion, NewEvent, SqliteEventStore, StoreOptions};
use rusqlite::{params, Connection};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

const SINGLES: usize = 5000;
const BATCHES: usize = 3000;
const BATCH: usize = 100;
/// Rounds of the ours-against-raw comparison: odd, so the median is one of them.
const ROUNDS: usize = 15;
/// Rounds of the chained / unchained pair of single appends: odd.
const CHAIN_ROUNDS: usize = 31;
/// Single appends in each of those rounds, each way.
const CHAIN_SINGLES: usize = 600;
/// Rounds of the 1-thread / 8-thread pair: odd, so the median is one of them.
const MT_ROUNDS: usize = 9;
/// Rounds of the checkpoint latency comparison, each mode once per round.
const LAT_ROUNDS: usize = 4;
/// The session's events in the million-event log of the bundle figures.
const SESSION_EVENTS: usize = 1000;
/// Rounds of checking its bundle: odd.
const BUNDLE_ROUNDS: usize = 11;
/// Payloads erased for `erase_ms`: odd.
const ERASE_ROUNDS: usize = 5;

fn event(i: usize) -> NewEvent {
    NewEvent::new(
        "bench.tick",
        1,
        json!({"i": i, "text": "a typical small payload of an agent event"}),
    )
}

fn fresh(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", p.display()));
    }
    p
}

/// The raw baseline: one connection, the store's schema and pragmas, a transaction per commit;
/// each row with a 32-byte hash as the store's rows have (not computed: what the chain costs to
/// compute is `chain_append_ratio`'s to say).
fn raw_conn(path: &Path) -> Connection {
    let c = Connection::open(path).expect("open raw");
    c.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0))
        .expect("wal");
    c.pragma_update(None, "synchronous", 2).expect("sync");
    c.execute_batch(
        "CREATE TABLE events (position INTEGER PRIMARY KEY, event_id TEXT NOT NULL UNIQUE,
         stream_id TEXT NOT NULL, stream_version INTEGER NOT NULL, type_id TEXT NOT NULL,
         schema_version INTEGER NOT NULL, timestamp_ms INTEGER NOT NULL, correlation_id TEXT,
         causation_id TEXT, payload TEXT NOT NULL, hash BLOB,
         UNIQUE (stream_id, stream_version));",
    )
    .expect("schema");
    c
}

fn raw_insert(c: &Connection, version: &mut i64, events: &[NewEvent]) {
    c.execute_batch("BEGIN IMMEDIATE").expect("begin");
    {
        let mut stmt = c
            .prepare_cached(
                "INSERT INTO events (event_id, stream_id, stream_version, type_id, schema_version,
                 timestamp_ms, correlation_id, causation_id, payload, hash)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )
            .expect("prepare");
        for e in events {
            *version += 1;
            stmt.execute(params![
                e.event_id.as_str(),
                "bench",
                *version,
                e.type_id,
                e.schema_version,
                0i64,
                e.correlation_id,
                e.causation_id,
                e.payload.to_string(),
                &[*version as u8; 32][..]
            ])
            .expect("insert");
        }
    }
    c.execute_batch("COMMIT").expect("commit");
}

/// Flushes every dirty page first, so one run's writeback does not land in the next run's time.
fn settle() {
    let _ = std::process::Command::new("sync").status();
}

fn raw_rate(dir: &Path, batch: usize, n: usize) -> f64 {
    let c = raw_conn(&fresh(dir, "raw.db"));
    settle();
    let events: Vec<Vec<NewEvent>> = (0..n)
        .map(|i| (0..batch).map(|j| event(i * batch + j)).collect())
        .collect();
    let mut version = 0;
    let t = Instant::now();
    for b in &events {
        raw_insert(&c, &mut version, b);
    }
    (n * batch) as f64 / t.elapsed().as_secs_f64()
}

fn ours_rate(dir: &Path, batch: usize, n: usize) -> f64 {
    ours_rate_on(
        SqliteEventStore::open(fresh(dir, "ours.db")).expect("open store"),
        batch,
        n,
    )
}

/// The same appends on a store without the hash chain (a test-only constructor).
fn unchained_rate(dir: &Path, batch: usize, n: usize) -> f64 {
    let path = fresh(dir, "unchained.db");
    let store = SqliteEventStore::open_unchained_for_bench(path).expect("open unchained");
    ours_rate_on(store, batch, n)
}

fn ours_rate_on(store: SqliteEventStore, batch: usize, n: usize) -> f64 {
    settle();
    let events: Vec<Vec<NewEvent>> = (0..n)
        .map(|i| (0..batch).map(|j| event(i * batch + j)).collect())
        .collect();
    let t = Instant::now();
    for b in &events {
        store
            .append("bench", ExpectedVersion::Any, b)
            .expect("append");
    }
    (n * batch) as f64 / t.elapsed().as_secs_f64()
}

fn threaded_rate(dir: &Path, threads: usize, per_thread: usize) -> f64 {
    let store = Arc::new(SqliteEventStore::open(fresh(dir, "mt.db")).expect("open store"));
    settle();
    let t = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0..per_thread {
                    store
                        .append(&format!("s{k}"), ExpectedVersion::Any, &[event(i)])
                        .expect("append");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    (threads * per_thread) as f64 / t.elapsed().as_secs_f64()
}

/// Every append's latency (µs) from `threads` threads appending `per_thread` events each to
/// a fresh store with checkpoints in `mode`.
fn threaded_latencies(
    dir: &Path,
    mode: Checkpoints,
    threads: usize,
    per_thread: usize,
) -> Vec<f64> {
    let options = StoreOptions {
        checkpoints: mode,
        ..StoreOptions::default()
    };
    let store =
        Arc::new(SqliteEventStore::open_with(fresh(dir, "lat.db"), options).expect("open store"));
    settle();
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                (0..per_thread)
                    .map(|i| {
                        let e = event(i);
                        let t = Instant::now();
                        store
                            .append(&format!("s{k}"), ExpectedVersion::Any, &[e])
                            .expect("append");
                        t.elapsed().as_secs_f64() * 1e6
                    })
                    .collect::<Vec<f64>>()
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("thread"))
        .collect()
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn p50_append_latency_us(store: &SqliteEventStore, n: usize) -> f64 {
    let mut lat: Vec<f64> = (0..n)
        .map(|i| {
            let e = event(i);
            let t = Instant::now();
            store
                .append("probe", ExpectedVersion::Any, &[e])
                .expect("append");
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    lat[n / 2]
}

fn fill(store: &SqliteEventStore, upto: usize) {
    let mut have = store.last_position().expect("pos") as usize;
    while have < upto {
        let n = (upto - have).min(5000);
        let batch: Vec<NewEvent> = (0..n).map(|i| event(have + i)).collect();
        store
            .append(&format!("fill{}", have % 97), ExpectedVersion::Any, &batch)
            .expect("fill");
        have += n;
    }
}

/// Fills `store` up to `upto` events, one in every `upto / SESSION_EVENTS` of them an event of
/// session `bench` (its stream's and, every other one, a tool run's that names it).
fn fill_with_session(store: &SqliteEventStore, upto: usize) {
    let have = store.last_position().expect("pos") as usize;
    let step = (upto - have) / SESSION_EVENTS;
    for k in 0..SESSION_EVENTS {
        let e = NewEvent::new("bench.step", 1, json!({"session_id": "bench", "k": k}));
        let stream = if k % 2 == 0 {
            "session-bench".to_owned()
        } else {
            format!("tool-{k}")
        };
        store
            .append(&stream, ExpectedVersion::Any, &[e])
            .expect("session event");
        fill(store, have + (k + 1) * step);
    }
    fill(store, upto);
}

/// The session bundle figures on a log of about a million events: exporting it, and checking
/// it with only the public key (reading its text included), the median of `BUNDLE_ROUNDS`.
fn bundle_figures(dir: &Path, db: &Path) {
    use correx::evidence::{export_session, verify_bundle, SigningKey};
    let key = SigningKey::generate(&dir.join("bench.key")).expect("key");
    let t = Instant::now();
    let bundle = export_session(db, "bench", &key).expect("export");
    let export_ms = t.elapsed().as_secs_f64() * 1e3;
    let text = bundle.to_string();
    let public = key.public();
    let times: Vec<f64> = (0..BUNDLE_ROUNDS)
        .map(|_| {
            let t = Instant::now();
            let v: serde_json::Value = serde_json::from_str(&text).expect("parse");
            let r = verify_bundle(&v, &public, None).expect("verify");
            assert_eq!(r.events, SESSION_EVENTS);
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    println!(
        "bundle_log_events: {}",
        bundle["checkpoint"]["tree_size"].as_u64().unwrap_or(0)
    );
    println!("bundle_events: {SESSION_EVENTS}");
    println!("bundle_bytes: {}", text.len());
    println!("export_session_ms: {export_ms:.0}");
    println!("verify_bundle_ms: {:.1}", median(times));
    // Erasing: the record appended, the payload replaced, the WAL emptied; each of a few of
    // the session's events in turn, on the million-event log.
    let store = SqliteEventStore::open(db).expect("open to erase");
    let erase: Vec<f64> = bundle["events"]
        .as_array()
        .expect("events")
        .iter()
        .take(ERASE_ROUNDS)
        .map(|e| {
            let position = e["position"].as_u64().expect("position");
            let t = Instant::now();
            store.erase(position, "bench", None).expect("erase");
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    println!("erase_ms: {:.1}", median(erase));
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Appends `n` events at a steady pace, each carrying the wall time its append started.
fn paced_writer(store: &dyn EventStore, n: usize) {
    for _ in 0..n {
        let e = NewEvent::new("bench.live", 1, json!({"sent_ns": now_ns()}));
        store
            .append("live", ExpectedVersion::Any, &[e])
            .expect("append");
        std::thread::sleep(std::time::Duration::from_millis(3));
    }
}

/// p50 of (delivery - append start) over `n` live events, in ms.
fn subscription_p50_ms(
    store: &Arc<SqliteEventStore>,
    n: usize,
    spawn_writer: impl FnOnce(),
) -> f64 {
    let after = store.last_position().expect("pos");
    let mut sub = store.subscribe(after).expect("subscribe");
    spawn_writer();
    let mut lat = Vec::with_capacity(n);
    while lat.len() < n {
        let e = sub
            .next_timeout(std::time::Duration::from_secs(30))
            .expect("subscription")
            .expect("an event within 30 s");
        let sent = e.payload["sent_ns"].as_u64().unwrap_or(0);
        lat.push(now_ns().saturating_sub(sent) as f64 / 1e6);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    lat[n / 2]
}

/// A loopback OTLP receiver: answers every request 200 at once and hands over each body with
/// the moment it arrived.
fn receiver() -> (u16, std::sync::mpsc::Receiver<(Instant, Vec<u8>)>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut out = conn.try_clone().expect("clone");
                let mut r = BufReader::new(conn);
                loop {
                    let mut len = 0usize;
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if let Some((k, v)) = line.split_once(':') {
                            if k.eq_ignore_ascii_case("content-length") {
                                len = v.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    let mut body = vec![0; len];
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    let at = Instant::now();
                    let _ = out.write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
                    );
                    if tx.send((at, body)).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, rx)
}

/// From the append of a tool run's outcome to its span arriving at a loopback receiver,
/// through a live exporter, one run at a time (ms).
fn export_lags(dir: &Path, n: usize) -> Vec<f64> {
    let (port, arrivals) = receiver();
    let store = Arc::new(SqliteEventStore::open(fresh(dir, "export.db")).expect("open"));
    let config = correx::OtlpConfig {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        ..correx::OtlpConfig::default()
    };
    let exporter =
        correx::OtlpExporter::start(&Arc::new(correx::EventLog::from(store.clone())), &config)
            .expect("exporter")
            .expect("an endpoint");
    let mut lags = Vec::with_capacity(n);
    for i in 0..n {
        let inv = format!("bench-inv-{i:06}");
        let done = correx::DomainEvent::ToolExecutionCompleted {
            session_id: "bench".into(),
            invocation_id: inv.clone(),
            tool_name: "shell".into(),
            duration_ms: 5,
            network: None,
        };
        let t0 = Instant::now();
        correx::append_domain(store.as_ref(), "session-bench", &done).expect("append");
        let needle = inv.as_bytes();
        loop {
            let (at, body) = arrivals
                .recv_timeout(std::time::Duration::from_secs(10))
                .expect("the span arrives");
            if body.windows(needle.len()).any(|w| w == needle) {
                lags.push(at.saturating_duration_since(t0).as_secs_f64() * 1000.0);
                break;
            }
        }
    }
    assert_eq!(exporter.stats().dropped, 0);
    lags
}

#[path = "common/pg.rs"]
mod pg;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("pg-writer") {
        // The cross-process writer of the PostgreSQL lag figure.
        pg::writer(&args[2], args[3].parse().expect("count"));
        return;
    }
    if args.get(1).map(String::as_str) == Some("writer") {
        // The cross-process writer, started by the subscription bench below.
        let store = SqliteEventStore::open(&args[2]).expect("open");
        paced_writer(&store, args[3].parse().expect("count"));
        return;
    }
    if args.iter().any(|a| a == "pg") {
        // `cargo bench --bench event_store -- pg`: the PostgreSQL figures alone.
        pg::run();
        return;
    }
    let dir = std::env::temp_dir().join(format!("correx-bench-events-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench dir");
    if args.iter().any(|a| a == "bundle") {
        // `cargo bench --bench event_store -- bundle`: the bundle figures alone.
        let store = SqliteEventStore::open(fresh(&dir, "big.db")).expect("open big");
        fill_with_session(&store, 1_000_000);
        drop(store);
        bundle_figures(&dir, &dir.join("big.db"));
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    println!("durability: FULL (synchronous=2, WAL)");

    // Alternate ours and raw so drift in the disk's flush latency hits both alike.
    let (mut ours1, mut raw1, mut oursb, mut rawb) = (vec![], vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        // Alternate who goes first, too.
        if round % 2 == 0 {
            raw1.push(raw_rate(&dir, 1, SINGLES / ROUNDS));
            ours1.push(ours_rate(&dir, 1, SINGLES / ROUNDS));
            rawb.push(raw_rate(&dir, BATCH, BATCHES / ROUNDS));
            oursb.push(ours_rate(&dir, BATCH, BATCHES / ROUNDS));
        } else {
            ours1.push(ours_rate(&dir, 1, SINGLES / ROUNDS));
            raw1.push(raw_rate(&dir, 1, SINGLES / ROUNDS));
            oursb.push(ours_rate(&dir, BATCH, BATCHES / ROUNDS));
            rawb.push(raw_rate(&dir, BATCH, BATCHES / ROUNDS));
        }
    }
    // Each round's two runs are back to back, so their ratio is taken under one disk mood: the
    // ratios are the medians of the rounds' ratios.
    let ratio =
        |ours: &[f64], raw: &[f64]| median(ours.iter().zip(raw).map(|(o, r)| o / r).collect());
    let (single_ratio, batch_ratio) = (ratio(&ours1, &raw1), ratio(&oursb, &rawb));
    let (ours1, raw1, oursb, rawb) = (median(ours1), median(raw1), median(oursb), median(rawb));
    // The chain's cost: the same appends with and without it, back to back, alternating. Single
    // durable appends wait on the disk's flush, whose spread is wider than the chain's cost:
    // more rounds than above.
    let (mut chain1, mut chainb) = (vec![], vec![]);
    for round in 0..CHAIN_ROUNDS {
        let pair = |batch: usize, n: usize| {
            if round % 2 == 0 {
                let plain = unchained_rate(&dir, batch, n);
                ours_rate(&dir, batch, n) / plain
            } else {
                let chained = ours_rate(&dir, batch, n);
                chained / unchained_rate(&dir, batch, n)
            }
        };
        chain1.push(pair(1, CHAIN_SINGLES));
        if round < ROUNDS {
            chainb.push(pair(BATCH, BATCHES / ROUNDS));
        }
    }
    println!("append_single_events_per_s: {ours1:.0}");
    println!("append_batch100_events_per_s: {oursb:.0}");
    println!("raw_single_events_per_s: {raw1:.0}");
    println!("raw_batch100_events_per_s: {rawb:.0}");

    // Pairs of back-to-back runs, in alternating order: the disk's flush latency drifts by a
    // third within minutes here, so each pair's ratio is taken under the same drift, and the
    // speedup is the median of those ratios.
    let (mut ones, mut eights, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..MT_ROUNDS {
        let (one, eight) = if round % 2 == 0 {
            let one = threaded_rate(&dir, 1, 400);
            (one, threaded_rate(&dir, 8, 400))
        } else {
            let eight = threaded_rate(&dir, 8, 400);
            (threaded_rate(&dir, 1, 400), eight)
        };
        ones.push(one);
        eights.push(eight);
        ratios.push(eight / one);
    }
    let spread = (
        ratios.iter().copied().fold(f64::INFINITY, f64::min),
        ratios.iter().copied().fold(0.0, f64::max),
    );
    println!("durable_1_thread_appends_per_s: {:.0}", median(ones));
    println!("durable_8_thread_appends_per_s: {:.0}", median(eights));
    println!("group_commit_speedup: {:.2}", median(ratios));
    println!("group_commit_speedup_min: {:.2}", spread.0);
    println!("group_commit_speedup_max: {:.2}", spread.1);

    // Append latency from 8 threads with checkpoints inside commits (SQLite's default, and
    // this store's before) and on the store's checkpoint thread, in alternating rounds.
    let (mut before, mut after) = (Vec::new(), Vec::new());
    for round in 0..LAT_ROUNDS {
        let modes = if round % 2 == 0 {
            [Checkpoints::InCommit, Checkpoints::Background]
        } else {
            [Checkpoints::Background, Checkpoints::InCommit]
        };
        for mode in modes {
            let lat = threaded_latencies(&dir, mode, 8, 1000);
            match mode {
                Checkpoints::InCommit => before.extend(lat),
                _ => after.extend(lat),
            }
        }
    }
    println!(
        "append_p50_us_checkpoint_in_commit: {:.0}",
        percentile(&mut before, 0.50)
    );
    println!(
        "append_p99_us_checkpoint_in_commit: {:.0}",
        percentile(&mut before, 0.99)
    );
    println!("append_p50_us: {:.0}", percentile(&mut after, 0.50));
    println!("append_p99_us: {:.0}", percentile(&mut after, 0.99));

    let store = SqliteEventStore::open(fresh(&dir, "big.db")).expect("open big");
    fill(&store, 10_000);
    let p50_10k = p50_append_latency_us(&store, 300);
    let t = Instant::now();
    let mut from = 1;
    let mut read = 0usize;
    loop {
        let page = store.read_all(from, 1000).expect("read");
        match page.last() {
            Some(l) => from = l.position + 1,
            None => break,
        }
        read += page.len();
    }
    println!(
        "read_all_events_per_s: {:.0}",
        read as f64 / t.elapsed().as_secs_f64()
    );
    fill_with_session(&store, 1_000_000);
    let p50_1m = p50_append_latency_us(&store, 300);
    println!("append_p50_us_at_10k: {p50_10k:.0}");
    println!("append_p50_us_at_1m: {p50_1m:.0}");
    println!("append_p50_growth_1m_vs_10k: {:.2}", p50_1m / p50_10k);
    drop(store);
    let t = Instant::now();
    let report = correx::verify_log(&dir.join("big.db")).expect("verify");
    assert!(report.problems.is_empty(), "{:?}", report.problems.first());
    println!(
        "verify_events_per_s: {:.0}",
        report.events as f64 / t.elapsed().as_secs_f64()
    );
    bundle_figures(&dir, &dir.join("big.db"));

    let live = Arc::new(SqliteEventStore::open(fresh(&dir, "live.db")).expect("open live"));
    let writer_store = Arc::clone(&live);
    let mut in_proc_writer = None;
    let in_proc = subscription_p50_ms(&live, 200, || {
        in_proc_writer = Some(std::thread::spawn(move || {
            paced_writer(writer_store.as_ref(), 200)
        }));
    });
    if let Some(w) = in_proc_writer {
        w.join().expect("writer");
    }
    let mut child = None;
    let cross = subscription_p50_ms(&live, 200, || {
        child = Some(
            std::process::Command::new(std::env::current_exe().expect("exe"))
                .args(["writer", &dir.join("live.db").display().to_string(), "200"])
                .spawn()
                .expect("spawn writer"),
        );
    });
    if let Some(mut c) = child {
        c.wait().expect("writer exit");
    }
    println!("subscription_latency_in_process_p50_ms: {in_proc:.3}");
    println!("subscription_latency_cross_process_p50_ms: {cross:.3}");
    drop(live);
    let lags = export_lags(&dir, 200);
    println!(
        "export_lag_ms_p50: {:.2}",
        percentile(&mut lags.clone(), 0.50)
    );
    println!(
        "export_lag_ms_p99: {:.2}",
        percentile(&mut lags.clone(), 0.99)
    );
    let _ = std::fs::remove_dir_all(&dir);
    println!("append_ratio_vs_raw: {single_ratio:.3}");
    println!("batch_ratio_vs_raw: {batch_ratio:.3}");
    println!("chain_append_ratio: {:.3}", median(chain1));
    println!("chain_batch_ratio: {:.3}", median(chainb));
    pg::run();
}
