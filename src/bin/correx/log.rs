//! `correx log show|tail|verify|seal|audit`.

use crate::args::Args;
use crate::style::{colour_of, line, Format};
use crate::Failure;
use correx::{
    export_log_otlp, format_rfc3339_ms, render_metrics, verify_log_sealed, EventLog, EventStore,
    EventStoreError, EventType, LogMetrics, RecordedEvent, Seal, SealKey, StoreOptions,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Opens an existing log (never creating one).
pub fn open(path: &str) -> Result<Arc<EventLog>, Failure> {
    EventLog::open_existing(path, StoreOptions::default())
        .map(Arc::new)
        .map_err(store_failure)
}

/// Whether `db` names a database rather than a file.
fn is_url(db: &str) -> bool {
    db.contains("://")
}

pub fn store_failure(e: EventStoreError) -> Failure {
    Failure::Run(e.to_string())
}

/// Every event after `after`, in pages.
pub fn for_each_event(
    store: &EventLog,
    after: u64,
    mut f: impl FnMut(RecordedEvent) -> bool,
) -> Result<(), Failure> {
    let mut from = after + 1;
    loop {
        let page = store.read_all(from, 1000).map_err(store_failure)?;
        let Some(last) = page.last().map(|e| e.position) else {
            return Ok(());
        };
        for e in page {
            if !f(e) {
                return Ok(());
            }
        }
        from = last + 1;
    }
}

/// One line for people: what happened. Control characters (a server's or a tool's text can
/// hold escape sequences or newlines) are shown as `?`, so no line of the log can forge
/// another or drive the terminal.
pub fn summary(e: &RecordedEvent) -> String {
    let line = match e.domain() {
        Ok(Some(d)) => d.summary(),
        Ok(None) | Err(_) => {
            let text = e.payload.to_string();
            let mut short: String = text.chars().take(100).collect();
            if short.len() < text.len() {
                short.push('…');
            }
            short
        }
    };
    line.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Prints events as a table (aligned to the widest stream and type of the batch) or JSON
/// lines.
pub fn print(events: &[RecordedEvent], format: Format) {
    match format {
        Format::JsonLines => {
            for e in events {
                let mut v = serde_json::to_value(e).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("time".into(), e.timestamp_rfc3339().into());
                }
                line(&v.to_string());
            }
        }
        Format::Table { colour } => {
            let pos_w = events
                .iter()
                .map(|e| e.position.to_string().len())
                .max()
                .unwrap_or(1);
            let stream_w = events
                .iter()
                .map(|e| e.stream_id.len())
                .max()
                .unwrap_or(6)
                .clamp(6, 40);
            let type_w = events
                .iter()
                .map(|e| e.type_id.len())
                .max()
                .unwrap_or(4)
                .clamp(4, 40);
            for e in events {
                let (on, off) = if colour {
                    (colour_of(&e.type_id), "\x1b[0m")
                } else {
                    ("", "")
                };
                line(&format!(
                    "{:>pos_w$}  {}  {:<stream_w$}  {on}{:<type_w$}{off}  {}",
                    e.position,
                    e.timestamp_rfc3339(),
                    e.stream_id,
                    e.type_id,
                    summary(e)
                ));
            }
        }
    }
}

/// `--since`: RFC 3339 UTC, or an age such as `90s`, `10m`, `2h`, `1d`; milliseconds since
/// the epoch.
pub fn parse_since(text: &str) -> Result<i64, Failure> {
    let bad = || {
        Failure::Usage(format!(
            "--since takes RFC 3339 (2026-12-01T12:00:00Z) or an age (90s, 10m, 2h, 1d), not {text:?}"
        ))
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    if let Some(unit) = text.chars().last().filter(char::is_ascii_alphabetic) {
        let n: i64 = text[..text.len() - 1].parse().map_err(|_| bad())?;
        let ms = match unit {
            's' => 1_000,
            'm' => 60_000,
            'h' => 3_600_000,
            'd' => 86_400_000,
            _ => return Err(bad()),
        };
        return Ok(now - n.saturating_mul(ms));
    }
    rfc3339_ms(text).ok_or_else(bad)
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM)`.
fn rfc3339_ms(t: &str) -> Option<i64> {
    let b = t.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| t.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &t[19..];
    let mut ms = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.chars().take_while(char::is_ascii_digit).count();
        let f = &frac[..digits];
        ms = format!("{f:0<3}")[..3].parse().ok()?;
        rest = &frac[digits..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) => {
            let sign = if o.starts_with('-') { -1 } else { 1 };
            sign * (o[1..3].parse::<i64>().ok()? * 60 + o[4..6].parse::<i64>().ok()?)
        }
        _ => return None,
    };
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y2, m2) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + h) * 60 + mi - offset_min) * 60_000 + s * 1000 + ms)
}

pub fn show(args: Args) -> Result<(), Failure> {
    let [db] = args.positionals(&["DB"])?[..] else {
        unreachable!("positionals returns exactly one")
    };
    let stream = args.value("--stream").map(str::to_owned);
    let type_id = args.value("--type").map(str::to_owned);
    let after = args.number("--after")?.unwrap_or(0);
    let limit = args.number("--limit")?.map(|n| n as usize);
    let since = args.value("--since").map(parse_since).transpose()?;
    let format = Format::choose(args.switch(&["--json"]));
    let store = open(db)?;
    let mut batch = Vec::new();
    let mut shown = 0usize;
    let mut result = Ok(());
    let walked = for_each_event(&store, after, |e| {
        if limit.is_some_and(|l| shown >= l) {
            return false;
        }
        let keep = stream.as_deref().is_none_or(|s| e.stream_id == s)
            && type_id.as_deref().is_none_or(|t| e.type_id == t)
            && since.is_none_or(|t| e.timestamp_ms >= t);
        if keep {
            shown += 1;
            batch.push(e);
            if batch.len() == 200 {
                print(&batch, format);
                batch.clear();
            }
        }
        true
    });
    if let Err(e) = walked {
        result = Err(e);
    }
    print(&batch, format);
    result
}

pub fn tail(args: Args) -> Result<(), Failure> {
    let [db] = args.positionals(&["DB"])?[..] else {
        unreachable!("positionals returns exactly one")
    };
    let n = args.number("-n")?.unwrap_or(10);
    let follow = args.switch(&["-f", "--follow"]);
    let format = Format::choose(args.switch(&["--json"]));
    let store = open(db)?;
    let last = store.last_position().map_err(store_failure)?;
    let start = last.saturating_sub(n);
    let mut recent = Vec::new();
    for_each_event(&store, start, |e| {
        recent.push(e);
        true
    })?;
    print(&recent, format);
    if !follow {
        return Ok(());
    }
    let after = recent.last().map_or(start, |e| e.position);
    let mut sub = store.subscribe(after).map_err(store_failure)?;
    loop {
        // Short waits, so a reader that went away is noticed while nothing is appended.
        match sub.next_timeout(Duration::from_millis(200)) {
            Ok(Some(e)) => print(&[e], format),
            Ok(None) if crate::style::reader_gone() => return Ok(()),
            Ok(None) => {}
            Err(e) => return Err(store_failure(e)),
        }
    }
}

/// `correx metrics DB`: the log's metrics as Prometheus text.
pub fn metrics(args: Args) -> Result<(), Failure> {
    let [db] = args.positionals(&["DB"])?[..] else {
        unreachable!("positionals returns exactly one")
    };
    let store = open(db)?;
    let mut metrics = LogMetrics::default();
    metrics.update(store.as_ref()).map_err(store_failure)?;
    print!("{}", render_metrics(&metrics, None));
    Ok(())
}

/// `correx log export DB --otlp URL`: the log as OTLP/HTTP traces.
pub fn export(args: Args) -> Result<(), Failure> {
    let [db] = args.positionals(&["DB"])?[..] else {
        unreachable!("positionals returns exactly one")
    };
    let Some(endpoint) = args.value("--otlp") else {
        return Err(Failure::Usage(
            "--otlp URL is required (e.g. http://127.0.0.1:4318)".into(),
        ));
    };
    let service = args.value("--service").unwrap_or("correx");
    let store = open(db)?;
    let report = export_log_otlp(store.as_ref(), endpoint, service)
        .map_err(|e| Failure::Run(e.to_string()))?;
    line(&format!(
        "exported {} spans from {} events in {} requests",
        report.spans, report.events, report.requests
    ));
    Ok(())
}

/// The key of `--key-file`, if given.
fn key(args: &Args) -> Result<Option<SealKey>, Failure> {
    args.value("--key-file")
        .map(|k| SealKey::from_file(Path::new(k)).map_err(|e| Failure::Run(e.to_string())))
        .transpose()
}

pub fn seal(args: Args) -> Result<(), Failure> {
    let [db] = args.positionals(&["DB"])?[..] else {
        unreachable!("positionals returns exactly one")
    };
    if let Some(signing) = args.value("--signing-key") {
        if args.value("--key-file").is_some() {
            return Err(Failure::Usage(
                "--key-file signs an HMAC seal, --signing-key an Ed25519 checkpoint: give one"
                    .into(),
            ));
        }
        return crate::evidence::seal(db, signing, args.value("--append-to"));
    }
    let key = key(&args)?;
    // A file is read without being opened for writing; a database through the store.
    let seal = if is_url(db) {
        open(db)?.seal()
    } else {
        Seal::of_log(Path::new(db))
    }
    .map_err(|e| Failure::Run(format!("{db}: {e}")))?;
    if let Some(to) = args.value("--append-to") {
        seal.append_to(Path::new(to), key.as_ref())
            .map_err(|e| Failure::Run(e.to_string()))?;
    }
    line(&seal.to_line(key.as_ref()));
    Ok(())
}

pub fn verify(args: Args) -> Result<(), Failure> {
    let [db] = args.positionals(&["DB"])?[..] else {
        unreachable!("positionals returns exactly one")
    };
    let key = key(&args)?;
    let public = crate::evidence::public_key(&args)?;
    if key.is_some() && public.is_some() {
        return Err(Failure::Usage(
            "--key-file checks HMAC seals, --public-key Ed25519 checkpoints: give one".into(),
        ));
    }
    let checkpoints = match (args.value("--seal"), &public) {
        (Some(file), Some(public)) => {
            let text =
                std::fs::read_to_string(file).map_err(|e| Failure::Run(format!("{file}: {e}")))?;
            correx::evidence::Checkpoint::parse_all(&text, public)
                .map_err(|e| Failure::Run(format!("{file}: {e}")))?
        }
        _ => Vec::new(),
    };
    let seals = match args.value("--seal") {
        Some(_) if public.is_some() => checkpoints.iter().map(|c| c.seal()).collect(),
        Some(file) => Seal::read_file(Path::new(file), key.as_ref())
            .map_err(|e| Failure::Run(format!("{file}: {e}")))?,
        None if key.is_some() || public.is_some() => {
            return Err(Failure::Usage(
                "--key-file and --public-key check seals: give --seal FILE".into(),
            ))
        }
        None => Vec::new(),
    };
    let mut report = if is_url(db) {
        if !checkpoints.is_empty() {
            return Err(Failure::Run(format!(
                "{db}: Ed25519 checkpoints are checked on SQLite log files; a PostgreSQL log \
                 does not have them yet"
            )));
        }
        open(db)?.verify(&correx::check_domain_event, &seals)
    } else {
        verify_log_sealed(Path::new(db), &seals)
    }
    .map_err(store_failure)?;
    if !checkpoints.is_empty() {
        match correx::evidence::check_checkpoints(Path::new(db), &checkpoints) {
            Ok(found) => report.problems.extend(found),
            Err(e) => report.problems.push(correx::LogProblem {
                position: None,
                detail: format!("the checkpoints cannot be checked: {e}"),
            }),
        }
        report.problems.sort_by_key(|p| p.position);
    }
    let last = report.head.as_ref().map(|(p, _)| *p);
    print_problems(&report.problems, last, args.switch(&["--all"]));
    if report.problems.is_empty() {
        let chain = match (report.chained_from, report.unchained) {
            (None, 0) => "nothing to chain".to_owned(),
            (None, n) => format!("{n} unchained events (written before the chain)"),
            (Some(_), 0) => "the hash chain holds".to_owned(),
            (Some(from), _) => format!(
                "unchained up to position {}, the hash chain holds from {from}",
                from.saturating_sub(1)
            ),
        };
        let erased = match report.erased.len() {
            0 => String::new(),
            n => format!(", {n} payload(s) erased (their digests hold)"),
        };
        let sealed = match (report.seals, &report.head) {
            (0, _) => String::new(),
            (n, _) => format!(", {n} seal(s) match"),
        };
        line(&format!(
            "ok: {} events in {} streams, every stream gapless, every payload readable, \
             {chain}{erased}{sealed}",
            report.events, report.streams
        ));
        if let Some((position, hash)) = &report.head {
            line(&format!("head: position {position} hash {hash}"));
        }
        Ok(())
    } else {
        eprintln!(
            "correx: {db}: {} problem(s) in {} events",
            report.problems.len(),
            report.events
        );
        Err(Failure::Found)
    }
}

/// Prints each problem on a line, but a run of chain breaks at consecutive positions up to the
/// log's `last` (what one event inserted or deleted with the positions after it moved does:
/// every later event breaks) once: its first break, and how many events after it no longer
/// link (each on its own line with `all`).
fn print_problems(problems: &[correx::LogProblem], last: Option<u64>, all: bool) {
    let is_break = |p: &correx::LogProblem| p.detail.starts_with(correx::CHAIN_BREAK);
    let mut i = 0;
    while i < problems.len() {
        let p = &problems[i];
        // The breaks at the positions right after this one.
        let mut run = 0;
        if is_break(p) && !all {
            let mut at = p.position;
            for q in problems[i + 1..].iter().filter(|q| is_break(q)) {
                if at.map(|a| a + 1) != q.position {
                    break;
                }
                at = q.position;
                run += 1;
            }
            if at != last {
                run = 0;
            }
        }
        let more = match run {
            0 => String::new(),
            n => format!(
                "; after it {n} more events no longer link (to position {}; --all lists them)",
                p.position.unwrap_or(0) + n
            ),
        };
        match p.position {
            Some(pos) => line(&format!("position {pos}: {}{more}", p.detail)),
            None => line(&format!("{}{more}", p.detail)),
        }
        // Skip the run's breaks, keeping every other problem at their positions.
        let end = p.position.map_or(0, |x| x + run);
        i += 1;
        while run > 0 && i < problems.len() {
            if is_break(&problems[i]) && problems[i].position.is_some_and(|x| x <= end) {
                i += 1;
                continue;
            }
            if problems[i].position.is_some_and(|x| x > end) {
                break;
            }
            let q = &problems[i];
            line(&format!(
                "position {}: {}",
                q.position.unwrap_or(0),
                q.detail
            ));
            i += 1;
        }
    }
}

/// One tool run as the log tells it.
#[derive(Default)]
pub struct Run {
    pub session: String,
    pub tool: String,
    pub tier: Option<i64>,
    pub started_ms: Option<i64>,
    pub ended_ms: Option<i64>,
    pub approval: Option<String>,
    pub outcome: Option<String>,
    /// When the approval decision was recorded, and how long it took.
    pub decided_ms: Option<i64>,
    pub wait_ms: Option<i64>,
}

/// One step of a session as the log tells it.
#[derive(Default)]
pub struct Step {
    pub session: String,
    pub step: String,
    pub kind: String,
    pub started_ms: Option<i64>,
    pub tries: u64,
    pub failures: Vec<String>,
    /// `recorded` or `closed from <outcome>` once it has a result.
    pub result: Option<String>,
    pub invocation: Option<String>,
}

/// One residency of a model: from `model.loaded` to `model.unloaded`.
pub struct Residency {
    pub model: String,
    pub from_ms: i64,
    pub to_ms: Option<i64>,
    pub reason: Option<String>,
    pub pid: Option<u64>,
    pub port: Option<u64>,
    pub inferences: u64,
}

/// What the log says about models and tool runs, in log order.
#[derive(Default)]
pub struct History {
    pub residencies: Vec<Residency>,
    /// Tool runs by invocation id, in the order they first appear.
    pub runs: Vec<(String, Run)>,
    /// Inferences: model, end time, latency in ms.
    pub inferences: Vec<(String, i64, i64)>,
    /// Session steps by (session, key), in the order they first appear.
    pub steps: Vec<Step>,
    /// Instants: time, model or session, what.
    pub instants: Vec<(i64, String, String, bool)>,
    pub last_ms: i64,
}

impl History {
    pub fn read(store: &EventLog, session: Option<&str>) -> Result<History, Failure> {
        let mut h = History::default();
        let mut open: BTreeMap<String, usize> = BTreeMap::new();
        for_each_event(store, 0, |e| {
            h.last_ms = h.last_ms.max(e.timestamp_ms);
            h.add(&e, session, &mut open);
            true
        })?;
        Ok(h)
    }

    fn run(&mut self, id: &str) -> &mut Run {
        match self.runs.iter().position(|(i, _)| i == id) {
            Some(i) => &mut self.runs[i].1,
            None => {
                self.runs.push((id.to_owned(), Run::default()));
                let last = self.runs.len() - 1;
                &mut self.runs[last].1
            }
        }
    }

    /// Adds what one event says. The type is matched by name, every one of them, so a new
    /// event type is a compile error here until the audit decides what to show of it; the
    /// payload is read field by field, so an event a newer build wrote still shows what it can.
    fn add(
        &mut self,
        e: &RecordedEvent,
        session: Option<&str>,
        open: &mut BTreeMap<String, usize>,
    ) {
        let Some(ty) = EventType::of(&e.type_id) else {
            return;
        };
        match ty {
            EventType::ModelLoaded
            | EventType::ModelUnloaded
            | EventType::ModelEndpointFailover
            | EventType::InferenceCompleted => self.add_model_event(ty, e, open),
            // A run's progress, an embedding call and a prompt cache's fate mark no change of
            // state on the timeline.
            EventType::ToolProgress
            | EventType::EmbeddingCompleted
            | EventType::ModelCacheRestored
            | EventType::ModelCacheMissed
            | EventType::ModelCacheSaved
            // A signal marks no step: the wait it answers records its own completion.
            | EventType::SessionSignaled => {}
            EventType::JobStarted
            | EventType::JobExited
            | EventType::McpServerStarted
            | EventType::McpServerExited
            | EventType::McpRequestRefused
            | EventType::McpToolsPinned
            | EventType::McpToolHeld => self.add_process_event(ty, e, session),
            EventType::SessionStepStarted
            | EventType::SessionStepCompleted
            | EventType::SessionStepFailed
            | EventType::SessionWaiting => self.add_step_event(ty, e, session),
            EventType::ToolApprovalDecided
            | EventType::ToolApprovalRequested
            | EventType::ToolExecutionStarted
            | EventType::ToolExecutionCompleted
            | EventType::ToolExecutionFailed
            | EventType::ToolExecutionCancelled
            | EventType::ToolExecutionInterrupted
            | EventType::ToolNetworkDenied
            | EventType::WorkspaceStaged
            | EventType::WorkspaceSettled
            | EventType::ToolExecutionRejected => self.add_tool_event(ty, e, session),
        }
    }

    /// A model's load, unload, endpoint failover or inference. `open` maps a model to its
    /// residency still open.
    fn add_model_event(
        &mut self,
        ty: EventType,
        e: &RecordedEvent,
        open: &mut BTreeMap<String, usize>,
    ) {
        let p = &e.payload;
        let s = |k: &str| str_field(p, k);
        let t = e.timestamp_ms;
        match ty {
            EventType::ModelLoaded => {
                open.insert(s("model_id"), self.residencies.len());
                self.residencies.push(Residency {
                    model: s("model_id"),
                    from_ms: t,
                    to_ms: None,
                    reason: None,
                    pid: p["pid"].as_u64(),
                    port: p["port"].as_u64(),
                    inferences: 0,
                });
            }
            EventType::ModelUnloaded => {
                let reason = s("reason");
                if let Some(i) = open.remove(&s("model_id")) {
                    self.residencies[i].to_ms = Some(t);
                    self.residencies[i].reason = Some(reason.clone());
                }
                if matches!(reason.as_str(), "crashed" | "unresponsive") {
                    self.instants.push((
                        t,
                        s("model_id"),
                        format!("{} {reason}", s("model_id")),
                        true,
                    ));
                }
            }
            EventType::ModelEndpointFailover => self.instants.push((
                t,
                s("model_id"),
                format!("failover {} → {}", s("from"), s("to")),
                true,
            )),
            EventType::InferenceCompleted => {
                if let Some(&i) = open.get(&s("model_id")) {
                    self.residencies[i].inferences += 1;
                }
                self.inferences
                    .push((s("model_id"), t, p["latency_ms"].as_i64().unwrap_or(0)));
            }
            // `add` routes no other type here.
            _ => {}
        }
    }

    /// A background job's or an MCP server's start or end: an instant.
    fn add_process_event(&mut self, ty: EventType, e: &RecordedEvent, session: Option<&str>) {
        let s = |k: &str| str_field(&e.payload, k);
        let t = e.timestamp_ms;
        match ty {
            EventType::JobStarted | EventType::JobExited => {
                let sess = s("session_id");
                if session.is_some_and(|want| want != sess) {
                    return;
                }
                let label = match ty {
                    EventType::JobStarted => format!("job {} started", s("job_id")),
                    _ => format!("job {} ended ({})", s("job_id"), s("reason")),
                };
                let alarming = s("reason") == "interrupted";
                self.instants.push((t, sess, label, alarming));
            }
            EventType::McpServerStarted
            | EventType::McpServerExited
            | EventType::McpRequestRefused
            | EventType::McpToolsPinned
            | EventType::McpToolHeld => {
                let label = match ty {
                    EventType::McpServerStarted => format!("mcp {} started", s("server")),
                    EventType::McpToolsPinned => {
                        format!("mcp {}: tool definitions pinned ({})", s("server"), s("by"))
                    }
                    EventType::McpToolHeld => format!(
                        "mcp {}: tool {} changed; held ({})",
                        s("server"),
                        s("tool"),
                        s("action")
                    ),
                    EventType::McpRequestRefused => format!(
                        "mcp {}: a request to {}:{} refused ({})",
                        s("server"),
                        s("host"),
                        e.payload["port"],
                        s("reason")
                    ),
                    _ => format!("mcp {} ended ({})", s("server"), s("reason")),
                };
                let alarming = matches!(ty, EventType::McpRequestRefused | EventType::McpToolHeld)
                    || matches!(s("reason").as_str(), "crashed" | "line_too_long");
                self.instants.push((t, s("server"), label, alarming));
            }
            // `add` routes no other type here.
            _ => {}
        }
    }

    /// A durable session step's start, result or failed try.
    fn add_step_event(&mut self, ty: EventType, e: &RecordedEvent, session: Option<&str>) {
        let p = &e.payload;
        let s = |k: &str| str_field(p, k);
        let t = e.timestamp_ms;
        let sess = s("session_id");
        if session.is_some_and(|want| want != sess) {
            return;
        }
        let key = s("step");
        let i = match self
            .steps
            .iter()
            .position(|x| x.session == sess && x.step == key)
        {
            Some(i) => i,
            None => {
                self.steps.push(Step {
                    session: sess,
                    step: key,
                    kind: s("kind"),
                    ..Step::default()
                });
                self.steps.len() - 1
            }
        };
        let step = &mut self.steps[i];
        match ty {
            EventType::SessionWaiting => {
                step.started_ms.get_or_insert(t);
                step.kind = "wait".into();
                step.failures
                    .push(format!("waits for signal {:?}", s("name")));
            }
            EventType::SessionStepStarted => {
                step.started_ms.get_or_insert(t);
                step.tries += 1;
                if let Some(id) = p["invocation_id"].as_str() {
                    step.invocation = Some(id.to_owned());
                }
            }
            EventType::SessionStepFailed => {
                let error: String = s("error").chars().take(100).collect();
                step.failures.push(error);
            }
            _ => {
                step.result = Some(match p["recovered"].as_str() {
                    Some(from) => format!("closed from {from}"),
                    None => "recorded".into(),
                });
            }
        }
    }

    /// A tool run's approval, start, outcome or network denial: its run, and an instant for
    /// a rejection or a denial.
    fn add_tool_event(&mut self, ty: EventType, e: &RecordedEvent, session: Option<&str>) {
        let s = |k: &str| str_field(&e.payload, k);
        let sess = s("session_id");
        if session.is_some_and(|want| want != sess) {
            return;
        }
        let run = self.run(&s("invocation_id"));
        run.session = sess.clone();
        run.tool = s("tool_name");
        if let Some(label) = record_tool_event(run, ty, e) {
            self.instants.push((e.timestamp_ms, sess, label, false));
        }
    }
}

/// A payload's string field, empty when absent or not a string.
fn str_field(p: &serde_json::Value, k: &str) -> String {
    p[k].as_str().unwrap_or_default().to_owned()
}

/// Writes what a tool event says into its run; the label of the instant it marks, if any.
fn record_tool_event(run: &mut Run, ty: EventType, e: &RecordedEvent) -> Option<String> {
    let p = &e.payload;
    let s = |k: &str| str_field(p, k);
    let t = e.timestamp_ms;
    match ty {
        EventType::ToolExecutionStarted => {
            run.started_ms = Some(t);
            run.tier = p["tier"].as_i64();
            if run.approval.is_none() {
                run.approval = Some(match run.tier {
                    Some(0 | 1) => "not needed (tier below 2)".into(),
                    _ => "approved".into(),
                });
            }
        }
        EventType::ToolApprovalRequested => {
            run.tier = p["tier"].as_i64();
            run.approval = Some(format!("requested ({}), waiting", s("asked_by")));
            return Some(format!("{} waits for a decision", run.tool));
        }
        EventType::ToolApprovalDecided => {
            let by = p["decided_by"].as_str().unwrap_or("the approval engine");
            let wait = p["wait_ms"].as_i64().unwrap_or(0);
            run.tier = p["tier"].as_i64();
            run.approval = Some(format!("{} by {by} after {wait} ms", s("decision")));
            run.decided_ms = Some(t);
            run.wait_ms = Some(wait);
        }
        EventType::ToolExecutionCompleted => {
            run.ended_ms = Some(t);
            run.outcome = Some(format!("completed in {} ms", p["duration_ms"]));
        }
        EventType::ToolExecutionFailed => {
            run.ended_ms = Some(t);
            let reason: String = s("reason").chars().take(100).collect();
            run.outcome = Some(format!("failed: {reason}"));
        }
        EventType::ToolExecutionCancelled => {
            run.ended_ms = Some(t);
            run.outcome = Some("cancelled (files restored)".into());
        }
        EventType::ToolExecutionInterrupted => {
            run.ended_ms = Some(t);
            run.outcome = Some(format!("interrupted by a crash ({})", s("state")));
        }
        EventType::ToolExecutionRejected => {
            run.tier = p["tier"].as_i64();
            run.ended_ms = Some(t);
            run.approval = Some(format!("denied: {}", s("reason")));
            run.outcome = Some("never ran".into());
            return Some(format!("{} rejected", run.tool));
        }
        EventType::ToolNetworkDenied => {
            return Some(format!(
                "{} refused {}:{} ({})",
                run.tool,
                s("host"),
                p["port"],
                s("reason")
            ));
        }
        EventType::WorkspaceStaged => {
            let paths = p["summary"]["paths"].as_u64().unwrap_or(0);
            return Some(format!(
                "{} staged {paths} paths ({})",
                run.tool,
                s("state")
            ));
        }
        EventType::WorkspaceSettled => {
            return Some(format!("change set {} by the {}", s("state"), s("by")));
        }
        EventType::ModelLoaded
        | EventType::ModelUnloaded
        | EventType::ModelEndpointFailover
        | EventType::InferenceCompleted
        | EventType::EmbeddingCompleted
        | EventType::ModelCacheRestored
        | EventType::ModelCacheMissed
        | EventType::ModelCacheSaved
        | EventType::JobStarted
        | EventType::JobExited
        | EventType::McpServerStarted
        | EventType::McpServerExited
        | EventType::McpRequestRefused
        | EventType::McpToolsPinned
        | EventType::McpToolHeld
        | EventType::ToolProgress
        | EventType::SessionStepStarted
        | EventType::SessionStepCompleted
        | EventType::SessionStepFailed
        | EventType::SessionWaiting
        | EventType::SessionSignaled => {}
    }
    None
}

pub fn audit(args: Args) -> Result<(), Failure> {
    let [db] = args.positionals(&["DB"])?[..] else {
        unreachable!("positionals returns exactly one")
    };
    let store = open(db)?;
    let h = History::read(&store, args.value("--session"))?;
    print_residencies(&h);
    print_runs(&h);
    print_steps(&h);
    Ok(())
}

/// The audit's `models:` section.
fn print_residencies(h: &History) {
    line("models:");
    if h.residencies.is_empty() {
        line("  none loaded");
    }
    for r in &h.residencies {
        let until = match (r.to_ms, &r.reason) {
            (Some(t), Some(reason)) => format!("{} ({reason})", format_rfc3339_ms(t)),
            _ => "still loaded at the end of the log".into(),
        };
        let server = match (r.pid, r.port) {
            (Some(pid), Some(port)) => format!("pid {pid}, port {port}"),
            _ => "remote".into(),
        };
        line(&format!(
            "  {:<20} {} → {until}; {server}; {} inference(s)",
            r.model,
            format_rfc3339_ms(r.from_ms),
            r.inferences
        ));
    }
}

/// The audit's `tool runs:` section, with the count of runs started without an outcome.
fn print_runs(h: &History) {
    line("tool runs:");
    if h.runs.is_empty() {
        line("  none");
    }
    let mut open_runs = 0;
    for (id, r) in &h.runs {
        let outcome = match (&r.outcome, r.started_ms) {
            (Some(o), _) => o.clone(),
            (None, Some(_)) => {
                open_runs += 1;
                "STARTED WITHOUT AN OUTCOME".into()
            }
            (None, None) => "unknown".into(),
        };
        let when = r
            .started_ms
            .or(r.ended_ms)
            .map(format_rfc3339_ms)
            .unwrap_or_default();
        line(&format!(
            "  {when}  session {}  {} (T{})  invocation {id}\n      approval: {}; outcome: {outcome}",
            r.session,
            r.tool,
            r.tier.map_or("?".into(), |t| t.to_string()),
            r.approval.as_deref().unwrap_or("unknown"),
        ));
    }
    if open_runs > 0 {
        line(&format!("{open_runs} run(s) started without an outcome"));
    }
}

/// The audit's `session steps:` section, when the log holds any.
fn print_steps(h: &History) {
    if !h.steps.is_empty() {
        line("session steps:");
    }
    for st in &h.steps {
        let when = st.started_ms.map(format_rfc3339_ms).unwrap_or_default();
        let result = st.result.as_deref().unwrap_or("NO RESULT YET");
        let run = st
            .invocation
            .as_ref()
            .map(|i| format!(", invocation {i}"))
            .unwrap_or_default();
        line(&format!(
            "  {when}  session {}  step {:?} ({}): {result}; {} tr{}{run}",
            st.session,
            st.step,
            st.kind,
            st.tries,
            if st.tries == 1 { "y" } else { "ies" },
        ));
        for f in &st.failures {
            line(&format!("      failed try: {f}"));
        }
    }
}
