//! The PostgreSQL half of `cargo bench --bench event_store`: correx's PostgreSQL store against
//! a bare client's INSERT of the same row in its own transaction, on the same server, in one
//! run. The server is the test cluster `scripts/postgres.sh` starts (`CORREX_TEST_PG_URL`,
//! `CORREX_TEST_PG_SOCKET_URL`, `PGPASSFILE`); without one the figures say `skipped`.

use super::{event, median, now_ns};
use correx::{EventLog, EventStore, ExpectedVersion, StoreOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rounds of the ours-against-raw pair: odd, so the median is one of them.
const ROUNDS: usize = 5;
/// Single appends in each round, each way: rounds of a few seconds, over which the server's
/// flush latency evens out (rounds of 300 read 0.82-0.86 where these read 0.86-0.92).
const SINGLES: usize = 1500;
/// Appends per thread in the writers comparison.
const PER_THREAD: usize = 150;
/// Live events timed from one process's append to another's delivery.
const LIVE: usize = 300;

/// A fresh database on the test server: its socket URL, which correx opens, and a bare
/// client's connection to it over the same socket.
fn fresh_db(name: &str) -> Option<(String, postgres::Client)> {
    let base = std::env::var("CORREX_TEST_PG_URL").ok()?;
    let socket = std::env::var("CORREX_TEST_PG_SOCKET_URL").ok()?;
    let db = format!("bench_{name}_{}", std::process::id());
    let mut admin = <postgres::Config as std::str::FromStr>::from_str(&socket)
        .expect("socket URL")
        .connect(postgres::NoTls)
        .expect("connect");
    // One statement each: DROP and CREATE DATABASE refuse the implicit transaction of a
    // multi-statement query.
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
        .expect("drop database");
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .expect("create database");
    // Both sides over the UNIX socket: the ratio is of the clients, not of two transports.
    // (The TCP URL is only checked to be there, as the tests use it.)
    let _ = base;
    let url = socket.replacen("@/correx?", &format!("@/{db}?"), 1);
    let conn = <postgres::Config as std::str::FromStr>::from_str(&url)
        .expect("socket URL")
        .connect(postgres::NoTls)
        .expect("connect to the bench database");
    Some((url, conn))
}

/// The bare client: `BEGIN`, a prepared INSERT of the row correx stores (its columns, a
/// 32-byte hash), `COMMIT`; appends per second over `n`.
fn raw_rate(c: &mut postgres::Client, start: usize, n: usize) -> f64 {
    let insert = c
        .prepare(
            "INSERT INTO raw_events (position, event_id, stream_id, stream_version, type_id, \
             schema_version, timestamp_ms, correlation_id, causation_id, payload, hash) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::text::json, $11)",
        )
        .expect("prepare");
    let t = Instant::now();
    for i in start..start + n {
        let e = event(i);
        let payload = serde_json::to_string(&e.payload).expect("json");
        let hash = [7u8; 32];
        let mut tx = c.transaction().expect("begin");
        tx.execute(
            &insert,
            &[
                &(i as i64 + 1),
                &e.event_id.to_string(),
                &"bench",
                &(i as i64 + 1),
                &e.type_id,
                &1i64,
                &0i64,
                &None::<String>,
                &None::<String>,
                &payload,
                &&hash[..],
            ],
        )
        .expect("insert");
        tx.commit().expect("commit");
    }
    n as f64 / t.elapsed().as_secs_f64()
}

fn ours_rate(store: &EventLog, start: usize, n: usize) -> f64 {
    let t = Instant::now();
    for i in start..start + n {
        store
            .append("bench", ExpectedVersion::Any, &[event(i)])
            .expect("append");
    }
    n as f64 / t.elapsed().as_secs_f64()
}

fn threaded_rate(store: &Arc<EventLog>, threads: usize) -> f64 {
    let t = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..PER_THREAD {
                    store
                        .append(&format!("w{k}"), ExpectedVersion::Any, &[event(i)])
                        .expect("append");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("writer");
    }
    (threads * PER_THREAD) as f64 / t.elapsed().as_secs_f64()
}

/// The writer process of the lag figure: appends `n` events at a steady pace, each carrying
/// the wall time its append started.
pub fn writer(url: &str, n: usize) {
    let store = EventLog::open(url, StoreOptions::default()).expect("open");
    super::paced_writer(&store, n);
}

/// Prints the PostgreSQL figures.
pub fn run() {
    let Some((url, mut raw)) = fresh_db("append") else {
        for name in [
            "pg_append_ratio_vs_raw",
            "pg_subscription_lag_ms_p50",
            "pg_writers_speedup",
        ] {
            println!("{name}: skipped (no test server: run scripts/postgres.sh start DIR)");
        }
        return;
    };
    let store = Arc::new(EventLog::open(&url, StoreOptions::default()).expect("open"));
    raw.batch_execute("CREATE TABLE raw_events (LIKE correx_events INCLUDING ALL)")
        .expect("raw table");
    // Warm both paths (statements, caches), then alternate rounds.
    ours_rate(&store, 0, 50);
    raw_rate(&mut raw, 1_000_000, 50);
    let (mut ours, mut bare, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..ROUNDS {
        let start = 100 + r * SINGLES;
        let (o, b) = if r % 2 == 0 {
            let o = ours_rate(&store, start, SINGLES);
            (o, raw_rate(&mut raw, start, SINGLES))
        } else {
            let b = raw_rate(&mut raw, start, SINGLES);
            (ours_rate(&store, start, SINGLES), b)
        };
        ours.push(o);
        bare.push(b);
        ratios.push(o / b);
    }
    println!("pg_append_per_s: {:.0}", median(ours));
    println!("pg_raw_insert_per_s: {:.0}", median(bare));
    println!("pg_append_ratio_vs_raw: {:.3}", median(ratios));

    let one = threaded_rate(&store, 1);
    let eight = threaded_rate(&store, 8);
    println!("pg_1_thread_appends_per_s: {one:.0}");
    println!("pg_8_thread_appends_per_s: {eight:.0}");
    println!("pg_writers_speedup: {:.2}", eight / one);

    // Lag: an append in another process to its delivery here.
    let after = store.last_position().expect("position");
    let mut sub = store.subscribe(after).expect("subscribe");
    // Let the listening connection come up before the first append.
    std::thread::sleep(Duration::from_millis(200));
    let exe = std::env::current_exe().expect("exe");
    let mut child = std::process::Command::new(exe)
        .args(["pg-writer", &url, &LIVE.to_string()])
        .spawn()
        .expect("writer process");
    let mut lags = Vec::with_capacity(LIVE);
    while lags.len() < LIVE {
        let e = sub
            .next_timeout(Duration::from_secs(30))
            .expect("subscription")
            .expect("an event within 30 s");
        let sent = e.payload["sent_ns"].as_u64().unwrap_or(0);
        lags.push(now_ns().saturating_sub(sent) as f64 / 1e6);
    }
    let _ = child.wait();
    lags.sort_by(|a, b| a.total_cmp(b));
    println!("pg_subscription_lag_ms_p50: {:.3}", lags[LIVE / 2]);
    println!("pg_subscription_lag_ms_p99: {:.3}", lags[LIVE * 99 / 100]);
}
