//! OpenTelemetry export: the log as OTLP/HTTP traces (protobuf), once (`export_log`, the
//! `correx log export` command) or live ([`OtlpExporter`]: it follows the log through a
//! subscription, so no appender ever waits on the network).

mod proto;
mod spans;

pub use proto::Span;
pub use spans::SpanFold;

use crate::events::{EventLog, EventStore, EventStoreError};
use parking_lot::Mutex;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

/// The semantic conventions the spans follow.
pub const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.41.0";

/// Spans per request at most.
const BATCH: usize = 512;

/// The largest queue a config may ask for (its slots are allocated up front).
const MAX_QUEUE: usize = 1_000_000;

/// The longest request timeout a config may ask for.
const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// What went wrong exporting.
#[derive(Debug)]
#[non_exhaustive]
pub enum OtlpError {
    /// The endpoint is not an `http://` or `https://` URL.
    BadEndpoint {
        /// What was given.
        endpoint: String,
    },
    /// Reading the log failed.
    Store(EventStoreError),
    /// The receiver could not be reached, or answered with an error.
    Send {
        /// The URL posted to.
        url: String,
        /// What happened.
        detail: String,
    },
}

impl fmt::Display for OtlpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OtlpError::BadEndpoint { endpoint } => write!(
                f,
                "the OTLP endpoint {endpoint:?} is not an http:// or https:// URL \
                 (e.g. http://127.0.0.1:4318)"
            ),
            OtlpError::Store(e) => write!(f, "{e}"),
            OtlpError::Send { url, detail } => write!(f, "exporting to {url}: {detail}"),
        }
    }
}

impl std::error::Error for OtlpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OtlpError::Store(e) => Some(e),
            _ => None,
        }
    }
}

/// The traces URL of an OTLP/HTTP endpoint: `/v1/traces` added to a base URL (a URL that
/// already ends with it is kept).
///
/// # Errors
/// [`OtlpError::BadEndpoint`] for anything but an `http://` or `https://` URL with a host.
pub fn traces_url(endpoint: &str) -> Result<String, OtlpError> {
    let bad = || OtlpError::BadEndpoint {
        endpoint: endpoint.to_owned(),
    };
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .ok_or_else(bad)?;
    if rest.is_empty() || rest.starts_with('/') || endpoint.chars().any(char::is_whitespace) {
        return Err(bad());
    }
    let base = endpoint.trim_end_matches('/');
    Ok(if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    })
}

fn agent(timeout: Duration) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .proxy(None)
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build();
    ureq::Agent::new_with_config(config)
}

/// Whether a failed request is worth one more try: the receiver unreachable or overloaded,
/// not a request it refused.
fn retryable(e: &OtlpError) -> bool {
    match e {
        OtlpError::Send { detail, .. } => {
            !detail.starts_with("HTTP 4") || detail.starts_with("HTTP 429")
        }
        _ => false,
    }
}

/// Posts `spans` as one `ExportTraceServiceRequest`.
fn send(agent: &ureq::Agent, url: &str, service: &str, spans: &[Span]) -> Result<(), OtlpError> {
    let body = proto::export_request(service, spans);
    let failed = |detail: String| OtlpError::Send {
        url: url.to_owned(),
        detail,
    };
    let mut resp = agent
        .post(url)
        .header("content-type", "application/x-protobuf")
        .send(&body[..])
        .map_err(|e| failed(e.to_string()))?;
    let status = resp.status().as_u16();
    // Drain the answer (an ExportTraceServiceResponse), so the connection is kept.
    let answer = resp
        .body_mut()
        .with_config()
        .limit(1 << 20)
        .read_to_vec()
        .unwrap_or_default();
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(failed(format!(
            "HTTP {status}: {}",
            crate::text::prefix(&String::from_utf8_lossy(&answer), 300)
        )))
    }
}

/// What an export did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportReport {
    /// Events read.
    pub events: u64,
    /// Spans sent.
    pub spans: u64,
    /// Requests made.
    pub requests: u64,
}

/// Exports the whole log at once: every span it tells, what is still open ended at the last
/// event and marked `correx.open`.
///
/// # Errors
/// [`OtlpError`]: a bad endpoint, the log unreadable, or the first request that failed.
pub fn export_log(
    store: &dyn EventStore,
    endpoint: &str,
    service: &str,
) -> Result<ExportReport, OtlpError> {
    let url = traces_url(endpoint)?;
    let agent = agent(Duration::from_secs(30));
    let mut fold = SpanFold::default();
    let mut report = ExportReport::default();
    let mut pending = Vec::new();
    let flush = |pending: &mut Vec<Span>, report: &mut ExportReport| {
        for chunk in pending.chunks(BATCH) {
            send(&agent, &url, service, chunk)?;
            report.spans += chunk.len() as u64;
            report.requests += 1;
        }
        pending.clear();
        Ok::<_, OtlpError>(())
    };
    let mut from = 1;
    loop {
        let page = store.read_all(from, 1000).map_err(OtlpError::Store)?;
        let Some(last) = page.last() else {
            break;
        };
        from = last.position + 1;
        for e in &page {
            report.events += 1;
            fold.fold(e);
        }
        pending.extend(fold.take());
        if pending.len() >= BATCH {
            flush(&mut pending, &mut report)?;
        }
    }
    fold.finish_open();
    pending.extend(fold.take());
    flush(&mut pending, &mut report)?;
    Ok(report)
}

/// The runtime config's `otlp` section: `{"endpoint": "http://127.0.0.1:4318",
/// "service_name": "correx", "queue_spans": 2048, "timeout_ms": 5000}`. Without `endpoint`,
/// nothing is exported.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// The OTLP/HTTP endpoint (`/v1/traces` is added).
    pub endpoint: Option<String>,
    /// `service.name` of the spans' resource; default `correx`.
    pub service_name: String,
    /// Spans waiting to be sent at most; past that new spans are dropped and counted.
    pub queue_spans: usize,
    /// How long one request may take (milliseconds in the config); default 5 s.
    #[serde(
        rename = "timeout_ms",
        deserialize_with = "crate::settings::millis::deserialize"
    )]
    pub timeout: Duration,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            endpoint: None,
            service_name: "correx".into(),
            queue_spans: 2048,
            timeout: Duration::from_secs(5),
        }
    }
}

impl crate::settings::Section for OtlpConfig {
    fn validate(&self) -> Result<(), crate::settings::ConfigError> {
        use crate::settings::{check, positive, positive_ms, ConfigError};
        if let Some(e) = &self.endpoint {
            traces_url(e).map_err(|err| ConfigError::new("endpoint", err.to_string()))?;
        }
        check(
            !self.service_name.trim().is_empty(),
            "service_name",
            "must not be empty",
        )?;
        positive("queue_spans", self.queue_spans as u64)?;
        check(
            self.queue_spans <= MAX_QUEUE,
            "queue_spans",
            format!("at most {MAX_QUEUE}"),
        )?;
        positive_ms("timeout_ms", self.timeout)?;
        check(
            self.timeout <= MAX_TIMEOUT,
            "timeout_ms",
            format!("at most {}", MAX_TIMEOUT.as_millis()),
        )
    }
}

/// What a live exporter did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    /// Spans the receiver accepted.
    pub exported: u64,
    /// Spans dropped: the queue was full, or their request failed.
    pub dropped: u64,
    /// Requests that failed (each try).
    pub failed_requests: u64,
    /// Times reading the log failed (the exporter retries after a second).
    pub follow_errors: u64,
}

#[derive(Default)]
struct Counters {
    exported: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    follow_errors: AtomicU64,
}

/// What the exporter's two threads share.
struct Shared {
    counters: Counters,
    /// Set when the exporter is dropped.
    stop: AtomicBool,
    /// The log's last position when stop was set: the follower drains up to it.
    stop_at: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl Shared {
    fn failed(&self, e: String) {
        let mut last = self.last_error.lock();
        if last.is_none() {
            log::warn!("correx: OTLP export: {e}");
        }
        *last = Some(e);
    }
}

/// Follows a log and exports each span as it ends (see the module docs). Spans wait in a
/// bounded queue for the sender thread; when it is full (a slow or absent receiver), new spans
/// are dropped and counted, never waited for. A request that fails for want of a receiver is
/// tried once more, then its spans are dropped and counted; the first failure is logged
/// (`log::warn!`). Dropping the exporter exports what the log holds by then, within one
/// request timeout: what is not sent by then is dropped and counted.
pub struct OtlpExporter {
    store: Arc<EventLog>,
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpExporter")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl OtlpExporter {
    /// Starts exporting what is appended to `store` from now on, as `config` says; `None`
    /// when it names no endpoint.
    ///
    /// # Errors
    /// [`OtlpError::BadEndpoint`]; [`OtlpError::Store`] when the log cannot be followed.
    pub fn start(store: &Arc<EventLog>, config: &OtlpConfig) -> Result<Option<Self>, OtlpError> {
        let Some(endpoint) = &config.endpoint else {
            return Ok(None);
        };
        let url = traces_url(endpoint)?;
        let from = store.last_position().map_err(OtlpError::Store)?;
        let mut sub = store.subscribe(from).map_err(OtlpError::Store)?;
        let shared = Arc::new(Shared {
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            stop_at: AtomicU64::new(u64::MAX),
            last_error: Mutex::new(None),
        });
        let (tx, rx) = sync_channel::<Span>(config.queue_spans.clamp(1, MAX_QUEUE));
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| OtlpError::Send {
                    url: url.clone(),
                    detail: format!("cannot start the export thread: {e}"),
                })
        };
        let follower = {
            let shared = shared.clone();
            spawn(
                "correx-otlp-follow",
                Box::new(move || follow(&mut sub, &tx, &shared)),
            )?
        };
        let sender = {
            let shared = shared.clone();
            let (service, timeout) = (config.service_name.clone(), config.timeout.min(MAX_TIMEOUT));
            let url = url.clone();
            spawn(
                "correx-otlp-send",
                Box::new(move || send_loop(&rx, &url, &service, timeout, &shared)),
            )?
        };
        Ok(Some(OtlpExporter {
            store: store.clone(),
            shared,
            threads: vec![follower, sender],
        }))
    }

    /// Spans exported and dropped so far.
    pub fn stats(&self) -> ExportStats {
        let c = &self.shared.counters;
        ExportStats {
            exported: c.exported.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            failed_requests: c.failed.load(Ordering::Relaxed),
            follow_errors: c.follow_errors.load(Ordering::Relaxed),
        }
    }

    /// The last error (a failed request, a failed read of the log), if any.
    pub fn last_error(&self) -> Option<String> {
        self.shared.last_error.lock().clone()
    }
}

impl Drop for OtlpExporter {
    fn drop(&mut self) {
        let at = self.store.last_position().unwrap_or(0);
        self.shared.stop_at.store(at, Ordering::Relaxed);
        self.shared.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The follower: events in, spans to the queue. On stop it reads on up to the position the
/// log had then, and waits for room in the queue (the sender, stopping too, drains it within
/// its deadline).
fn follow(sub: &mut crate::events::Subscription, tx: &SyncSender<Span>, shared: &Shared) {
    let mut fold = SpanFold::default();
    loop {
        let stopping = shared.stop.load(Ordering::Relaxed);
        if stopping && sub.position() >= shared.stop_at.load(Ordering::Relaxed) {
            return;
        }
        let wait = if stopping {
            Duration::ZERO
        } else {
            Duration::from_millis(100)
        };
        match sub.next_timeout(wait) {
            Ok(Some(e)) => {
                fold.fold(&e);
                for span in fold.take() {
                    let sent = if stopping {
                        tx.send(span).map_err(|_| ())
                    } else {
                        match tx.try_send(span) {
                            Ok(()) => Ok(()),
                            Err(TrySendError::Full(_)) => {
                                shared.counters.dropped.fetch_add(1, Ordering::Relaxed);
                                Ok(())
                            }
                            Err(TrySendError::Disconnected(_)) => Err(()),
                        }
                    };
                    if sent.is_err() {
                        return;
                    }
                }
            }
            Ok(None) if stopping => return,
            Ok(None) => {}
            Err(e) => {
                // A read that failed (a locked or damaged log): noted, and tried again.
                shared
                    .counters
                    .follow_errors
                    .fetch_add(1, Ordering::Relaxed);
                shared.failed(format!("reading the log: {e}"));
                if stopping {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// The sender: batches from the queue, posted; what is queued is sent as soon as it is there.
/// Once stopping, each batch gets one try, and past one timeout from the stop what is left is
/// dropped and counted.
fn send_loop(rx: &Receiver<Span>, url: &str, service: &str, timeout: Duration, shared: &Shared) {
    let agent = agent(timeout);
    let counters = &shared.counters;
    let mut deadline: Option<std::time::Instant> = None;
    loop {
        let stopping = shared.stop.load(Ordering::Relaxed);
        if stopping && deadline.is_none() {
            deadline = Some(std::time::Instant::now() + timeout);
        }
        let first = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(s) => s,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(s) => batch.push(s),
                Err(_) => break,
            }
        }
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            counters
                .dropped
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            continue;
        }
        let mut result = send(&agent, url, service, &batch);
        if let Err(e) = &result {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            if !stopping && retryable(e) {
                std::thread::sleep(Duration::from_millis(200));
                result = send(&agent, url, service, &batch);
                if result.is_err() {
                    counters.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        match result {
            Ok(()) => {
                counters
                    .exported
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                counters
                    .dropped
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                shared.failed(e.to_string());
            }
        }
    }
}
