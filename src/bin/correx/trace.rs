//! `correx log trace`: the log as Chrome trace events (the JSON object format), which Perfetto
//! and `chrome://tracing` show as a timeline.
//!
//! Process 1 holds the models: per model a track of its residencies (loaded to unloaded) and
//! tracks of its inferences (each from its start, the completion time less its latency, to its
//! completion; overlapping ones on separate tracks). Process 2 holds the sessions: per session
//! tracks of its tool runs, each from the request (its approval decision less the wait) to
//! the outcome, holding an `approval` span (the wait) and a `running` span (from
//! `tool.execution_started` to the outcome). Crashes, failovers and rejections are instant
//! events. Spans on one track nest: any two are apart or one holds the other.

use crate::args::Args;
use crate::log::{open, History};
use crate::style::line;
use crate::Failure;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Tracks of one process: a name's lanes, each holding the end of its last span.
#[derive(Default)]
struct Tracks {
    next_tid: u64,
    lanes: BTreeMap<String, Vec<(u64, i64)>>,
    names: Vec<(u64, String)>,
}

impl Tracks {
    /// A track for `name` free from `start` on, opening a new lane when all are busy.
    fn lane(&mut self, name: &str, start: i64, end: i64) -> u64 {
        let lanes = self.lanes.entry(name.to_owned()).or_default();
        if let Some(l) = lanes.iter_mut().find(|(_, free_at)| *free_at <= start) {
            l.1 = end;
            return l.0;
        }
        self.next_tid += 1;
        let tid = self.next_tid;
        let label = if lanes.is_empty() {
            name.to_owned()
        } else {
            format!("{name} ({})", lanes.len() + 1)
        };
        lanes.push((tid, end));
        self.names.push((tid, label));
        tid
    }

    /// The first track of `name` (for instants), creating it when needed.
    fn first(&mut self, name: &str) -> u64 {
        match self.lanes.get(name).and_then(|l| l.first()) {
            Some((tid, _)) => *tid,
            None => self.lane(name, i64::MIN, i64::MIN),
        }
    }
}

fn span(pid: u64, tid: u64, name: &str, from_ms: i64, to_ms: i64, args: Value) -> Value {
    json!({
        "ph": "X", "pid": pid, "tid": tid, "name": name, "cat": if pid == 1 { "model" } else { "tool" },
        "ts": from_ms * 1000, "dur": (to_ms - from_ms).max(0) * 1000, "args": args,
    })
}

pub fn trace(args: Args) -> Result<(), Failure> {
    let [db] = args.positionals(&["DB"])?[..] else {
        unreachable!("positionals returns exactly one")
    };
    let store = open(db)?;
    let h = History::read(&store, args.value("--session"))?;
    let mut events = Vec::new();
    let mut models = Tracks::default();
    let mut sessions = Tracks::default();
    // Lanes are taken in this order (residencies, inferences, runs, then instants), which
    // decides the track ids.
    model_spans(&h, &mut models, &mut events);
    run_spans(&h, &mut sessions, &mut events);
    instants(&h, &mut models, &mut sessions, &mut events);
    for (pid, name, tracks) in [(1, "models", &models), (2, "sessions", &sessions)] {
        events.push(json!({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}));
        for (tid, label) in &tracks.names {
            events.push(json!({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": label}}));
        }
    }
    line(&json!({"traceEvents": events, "displayTimeUnit": "ms"}).to_string());
    Ok(())
}

/// Process 1's spans: each residency of a model, then each inference.
fn model_spans(h: &History, models: &mut Tracks, events: &mut Vec<Value>) {
    for r in &h.residencies {
        let to = r.to_ms.unwrap_or(h.last_ms);
        let tid = models.lane(&r.model, r.from_ms, to);
        events.push(span(
            1,
            tid,
            &format!("{} resident", r.model),
            r.from_ms,
            to,
            json!({"pid": r.pid, "port": r.port, "reason": r.reason, "inferences": r.inferences}),
        ));
    }
    for (model, end, latency) in &h.inferences {
        let start = end - latency;
        let tid = models.lane(&format!("{model} inferences"), start, *end);
        events.push(span(
            1,
            tid,
            "inference",
            start,
            *end,
            json!({"model": model, "latency_ms": latency}),
        ));
    }
}

/// Process 2's spans: each tool run, holding its approval wait and its running time.
fn run_spans(h: &History, sessions: &mut Tracks, events: &mut Vec<Value>) {
    for (id, r) in &h.runs {
        let asked = r.decided_ms.map(|d| d - r.wait_ms.unwrap_or(0));
        let Some(start) = asked.or(r.started_ms) else {
            continue;
        };
        let end = r.ended_ms.unwrap_or(h.last_ms).max(start);
        let tid = sessions.lane(&format!("session {}", r.session), start, end);
        events.push(span(
            2,
            tid,
            &r.tool,
            start,
            end,
            json!({"invocation_id": id, "tier": r.tier, "approval": r.approval, "outcome": r.outcome}),
        ));
        if let Some(decided) = r.decided_ms {
            let label = r.approval.as_deref().unwrap_or("approval");
            events.push(span(
                2,
                tid,
                "approval",
                start,
                decided.min(end),
                json!({"decision": label}),
            ));
        }
        if let Some(ran) = r.started_ms {
            events.push(span(
                2,
                tid,
                "running",
                ran.max(start),
                end,
                json!({"outcome": r.outcome}),
            ));
        }
    }
}

/// Crashes, failovers, rejections and the like, on their owner's first track.
fn instants(h: &History, models: &mut Tracks, sessions: &mut Tracks, events: &mut Vec<Value>) {
    for (t, owner, what, is_model) in &h.instants {
        let (pid, tid) = if *is_model {
            (1, models.first(owner))
        } else {
            (2, sessions.first(&format!("session {owner}")))
        };
        events.push(
            json!({"ph": "i", "s": "t", "pid": pid, "tid": tid, "name": what, "ts": t * 1000}),
        );
    }
}
