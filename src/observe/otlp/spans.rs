//! The log as spans, in the OpenTelemetry GenAI semantic conventions (v1.41.0, Development):
//!
//! - a session is a trace (its id hashed to the trace id); each tool run in it is an
//!   `execute_tool {tool}` span (INTERNAL; `gen_ai.operation.name` `execute_tool`,
//!   `gen_ai.tool.name`, `gen_ai.tool.call.id` — the model's call id when a durable session
//!   step recorded one, else the invocation id —, `gen_ai.tool.type` `function`,
//!   `gen_ai.conversation.id`), from its approval request (or start) to its outcome, with the
//!   wait for its approval as a child span `approval {tool}`, each network denial a span event,
//!   and a failure, rejection or interruption an error status with `error.type`;
//! - each residency of a model (`model.loaded` to `model.unloaded`) is a trace whose root span
//!   `residency {model}` starts when the load began; a crash or an unresponsive server is a
//!   span event and an error status, an endpoint failover a span event;
//! - each inference is a `chat {model}` span (CLIENT; `gen_ai.request.model`,
//!   `gen_ai.response.model`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`,
//!   `gen_ai.response.finish_reasons`) under the residency that served it (the log does not tie
//!   an inference to a session).
//!
//! Ids are hashes of what the log names (session, invocation, model and position), so
//! exporting the same log twice gives the same spans.

use super::proto::{Span, SpanEvent, SpanKind, Value};
use crate::domain::DomainEvent;
use crate::events::RecordedEvent;
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// Open runs kept at most; past that the oldest is dropped (a host that died mid-run leaves
/// runs without an outcome).
const MAX_OPEN: usize = 10_000;

fn id<const N: usize>(parts: &[&str]) -> [u8; N] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    let digest = h.finalize();
    let mut out = [0u8; N];
    out.copy_from_slice(&digest[..N]);
    // An all-zero id is invalid in OTLP.
    if out.iter().all(|b| *b == 0) {
        out[N - 1] = 1;
    }
    out
}

fn nanos(ms: i64) -> u64 {
    u64::try_from(ms).unwrap_or(0).saturating_mul(1_000_000)
}

/// `ms` before `ts`, without overflow.
fn before(ts: i64, ms: u64) -> i64 {
    ts.saturating_sub(i64::try_from(ms).unwrap_or(i64::MAX))
}

fn s(v: &str) -> Value {
    Value::Str(v.to_owned())
}

struct Approval {
    from_ms: i64,
    to_ms: i64,
    decision: String,
    decided_by: String,
}

struct OpenRun {
    session: String,
    tool: String,
    tier: Option<i32>,
    start_ms: i64,
    approval: Option<Approval>,
    events: Vec<SpanEvent>,
    /// The position it was first seen at, to drop the oldest.
    seen: u64,
}

struct OpenResidency {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    start_ms: i64,
    pid: Option<u32>,
    port: Option<u16>,
    events: Vec<SpanEvent>,
}

/// Events in, finished spans out.
#[derive(Default)]
pub struct SpanFold {
    runs: HashMap<String, OpenRun>,
    calls: HashMap<String, String>,
    residencies: HashMap<String, OpenResidency>,
    ready: Vec<Span>,
    last_ms: i64,
    /// Open runs dropped at the bound.
    pub dropped_open: u64,
}

impl SpanFold {
    /// Spans finished so far, taken.
    pub fn take(&mut self) -> Vec<Span> {
        std::mem::take(&mut self.ready)
    }

    fn run(
        &mut self,
        inv: &str,
        session: &str,
        tool: &str,
        start_ms: i64,
        seen: u64,
    ) -> &mut OpenRun {
        if !self.runs.contains_key(inv) && self.runs.len() >= MAX_OPEN {
            if let Some(oldest) = self
                .runs
                .iter()
                .min_by_key(|(_, r)| r.seen)
                .map(|(k, _)| k.clone())
            {
                self.runs.remove(&oldest);
                self.dropped_open += 1;
            }
        }
        self.runs.entry(inv.to_owned()).or_insert_with(|| OpenRun {
            session: session.to_owned(),
            tool: tool.to_owned(),
            tier: None,
            start_ms,
            approval: None,
            events: Vec::new(),
            seen,
        })
    }

    /// Folds in one event.
    pub fn fold(&mut self, e: &RecordedEvent) {
        let ts = e.timestamp_ms;
        self.last_ms = self.last_ms.max(ts);
        let Ok(Some(d)) = e.domain() else {
            return;
        };
        // Every type is named here, so a new one is a compile error until it is placed; each
        // group's handler matches only the types routed to it.
        match d {
            DomainEvent::SessionStepStarted {
                invocation_id: Some(inv),
                call_id: Some(call),
                ..
            } => self.note_call(inv, call),
            d @ (DomainEvent::ToolApprovalDecided { .. }
            | DomainEvent::ToolExecutionStarted { .. }
            | DomainEvent::ToolNetworkDenied { .. }
            | DomainEvent::WorkspaceStaged { .. }) => self.on_tool_progress(e, d),
            // After the run's span ended; or, for a request, before its run (if any) began.
            DomainEvent::WorkspaceSettled { .. } | DomainEvent::ToolApprovalRequested { .. } => {}
            d @ (DomainEvent::ToolExecutionCompleted { .. }
            | DomainEvent::ToolExecutionCancelled { .. }) => self.on_tool_ended(e, d),
            d @ (DomainEvent::ToolExecutionFailed { .. }
            | DomainEvent::ToolExecutionRejected { .. }
            | DomainEvent::ToolExecutionInterrupted { .. }) => self.on_tool_stopped(e, d),
            d @ (DomainEvent::ModelLoaded { .. }
            | DomainEvent::ModelUnloaded { .. }
            | DomainEvent::ModelEndpointFailover { .. }) => self.on_model_event(e, d),
            d @ DomainEvent::InferenceCompleted { .. } => self.on_inference(e, d),
            DomainEvent::EmbeddingCompleted { .. }
            | DomainEvent::ModelCacheRestored { .. }
            | DomainEvent::ModelCacheMissed { .. }
            | DomainEvent::ModelCacheSaved { .. }
            | DomainEvent::SessionStepStarted { .. }
            | DomainEvent::SessionStepCompleted { .. }
            | DomainEvent::SessionStepFailed { .. }
            | DomainEvent::SessionWaiting { .. }
            | DomainEvent::SessionSignaled { .. }
            | DomainEvent::JobStarted { .. }
            | DomainEvent::JobExited { .. }
            | DomainEvent::McpServerStarted { .. }
            | DomainEvent::McpServerExited { .. }
            | DomainEvent::McpRequestRefused { .. }
            | DomainEvent::McpToolsPinned { .. }
            | DomainEvent::McpToolHeld { .. }
            | DomainEvent::ToolProgress { .. } => {}
        }
    }

    /// A durable step's model call id, for the tool span of the run it started.
    fn note_call(&mut self, inv: String, call: String) {
        if self.calls.len() >= MAX_OPEN {
            self.calls.clear();
        }
        self.calls.insert(inv, call);
    }

    /// A run's approval, start or network denial: opens the run or adds to it.
    fn on_tool_progress(&mut self, e: &RecordedEvent, d: DomainEvent) {
        let ts = e.timestamp_ms;
        match d {
            DomainEvent::ToolApprovalDecided {
                session_id,
                invocation_id,
                tool_name,
                tier,
                decision,
                decided_by,
                wait_ms,
                ..
            } => {
                let from = before(ts, wait_ms);
                let run = self.run(&invocation_id, &session_id, &tool_name, from, e.position);
                run.start_ms = run.start_ms.min(from);
                run.tier = Some(tier);
                run.approval = Some(Approval {
                    from_ms: from,
                    to_ms: ts,
                    decision,
                    decided_by,
                });
            }
            DomainEvent::ToolExecutionStarted {
                session_id,
                invocation_id,
                tool_name,
                tier,
                ..
            } => {
                self.run(&invocation_id, &session_id, &tool_name, ts, e.position)
                    .tier = Some(tier);
            }
            DomainEvent::ToolNetworkDenied {
                session_id,
                invocation_id,
                tool_name,
                host,
                port,
                reason,
            } => self
                .run(&invocation_id, &session_id, &tool_name, ts, e.position)
                .events
                .push(SpanEvent {
                    time_unix_nano: nanos(ts),
                    name: "network_denied".into(),
                    attributes: vec![
                        ("server.address".into(), s(&host)),
                        ("server.port".into(), Value::Int(port.into())),
                        ("correx.reason".into(), s(&reason)),
                    ],
                }),
            // `fold` routes no other type here.
            _ => {}
        }
    }

    /// A run that completed or was cancelled: ends its span after its recorded duration.
    fn on_tool_ended(&mut self, e: &RecordedEvent, d: DomainEvent) {
        match d {
            DomainEvent::ToolExecutionCompleted {
                session_id,
                invocation_id,
                tool_name,
                duration_ms,
                ..
            } => self.end_run(
                e,
                &session_id,
                &invocation_id,
                &tool_name,
                duration_ms,
                "completed",
                None,
            ),
            DomainEvent::ToolExecutionCancelled {
                session_id,
                invocation_id,
                tool_name,
                duration_ms,
                ..
            } => self.end_run(
                e,
                &session_id,
                &invocation_id,
                &tool_name,
                duration_ms,
                "cancelled",
                Some(("cancelled".into(), "cancelled".into())),
            ),
            // `fold` routes no other type here.
            _ => {}
        }
    }

    /// A run that failed, was rejected or was interrupted: ends its span with an error.
    fn on_tool_stopped(&mut self, e: &RecordedEvent, d: DomainEvent) {
        match d {
            DomainEvent::ToolExecutionFailed {
                session_id,
                invocation_id,
                tool_name,
                reason,
                kind,
                ..
            } => self.end_run(
                e,
                &session_id,
                &invocation_id,
                &tool_name,
                0,
                "failed",
                Some((kind.unwrap_or_else(|| "failed".into()), reason)),
            ),
            DomainEvent::ToolExecutionRejected {
                session_id,
                invocation_id,
                tool_name,
                reason,
                ..
            } => self.end_run(
                e,
                &session_id,
                &invocation_id,
                &tool_name,
                0,
                "rejected",
                Some(("rejected".into(), reason)),
            ),
            DomainEvent::ToolExecutionInterrupted {
                session_id,
                invocation_id,
                tool_name,
                state,
            } => self.end_run(
                e,
                &session_id,
                &invocation_id,
                &tool_name,
                0,
                "interrupted",
                Some((
                    "interrupted".into(),
                    format!("the host died mid-run; files {state}"),
                )),
            ),
            // `fold` routes no other type here.
            _ => {}
        }
    }

    /// A model's load, unload or endpoint failover: opens, ends or adds to its residency.
    fn on_model_event(&mut self, e: &RecordedEvent, d: DomainEvent) {
        let ts = e.timestamp_ms;
        match d {
            DomainEvent::ModelLoaded {
                model_id,
                load_ms,
                pid,
                port,
                ..
            } => {
                // A load of a model the log still has resident (its host died without the
                // unload recorded) ends the earlier residency where this load began.
                let start_ms = before(ts, load_ms);
                self.end_residency(&model_id, start_ms, "superseded");
                let position = e.position.to_string();
                self.residencies.insert(
                    model_id.clone(),
                    OpenResidency {
                        trace_id: id(&["residency trace", &model_id, &position]),
                        span_id: id(&["residency span", &model_id, &position]),
                        start_ms,
                        pid,
                        port,
                        events: Vec::new(),
                    },
                );
            }
            DomainEvent::ModelUnloaded {
                model_id, reason, ..
            } => self.end_residency(&model_id, ts, reason.as_str()),
            DomainEvent::ModelEndpointFailover {
                model_id,
                from,
                to,
                error,
            } => {
                if let Some(r) = self.residencies.get_mut(&model_id) {
                    r.events.push(SpanEvent {
                        time_unix_nano: nanos(ts),
                        name: "endpoint_failover".into(),
                        attributes: vec![
                            ("correx.from".into(), s(&from)),
                            ("correx.to".into(), s(&to)),
                            ("error.type".into(), s(&error)),
                        ],
                    });
                }
            }
            // `fold` routes no other type here.
            _ => {}
        }
    }

    /// An inference: a `chat` span under the residency that served it.
    fn on_inference(&mut self, e: &RecordedEvent, d: DomainEvent) {
        let DomainEvent::InferenceCompleted {
            model_id,
            usage,
            latency_ms,
            finish_reason,
            endpoint,
        } = d
        else {
            // `fold` routes no other type here.
            return;
        };
        let ts = e.timestamp_ms;
        let (trace_id, parent) = match self.residencies.get(&model_id) {
            Some(r) => (r.trace_id, Some(r.span_id)),
            None => (id(&["model", &model_id]), None),
        };
        let mut attributes = vec![
            ("gen_ai.operation.name".into(), s("chat")),
            ("gen_ai.provider.name".into(), s("llama.cpp")),
            ("gen_ai.request.model".into(), s(&model_id)),
            ("gen_ai.response.model".into(), s(&model_id)),
            (
                "gen_ai.usage.input_tokens".into(),
                Value::Int(usage.prompt_tokens.into()),
            ),
            (
                "gen_ai.usage.output_tokens".into(),
                Value::Int(usage.completion_tokens.into()),
            ),
            (
                "gen_ai.response.finish_reasons".into(),
                Value::Strs(vec![finish_reason]),
            ),
        ];
        if let Some(url) = endpoint {
            attributes.push(("correx.endpoint".into(), Value::Str(url)));
        }
        self.ready.push(Span {
            trace_id,
            span_id: id(&["chat", e.event_id.as_str()]),
            parent_span_id: parent,
            name: format!("chat {model_id}"),
            kind: SpanKind::Client,
            start_time_unix_nano: nanos(before(ts, latency_ms)),
            end_time_unix_nano: nanos(ts),
            attributes,
            events: Vec::new(),
            error: None,
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn end_run(
        &mut self,
        e: &RecordedEvent,
        session: &str,
        inv: &str,
        tool: &str,
        duration_ms: u64,
        outcome: &str,
        error: Option<(String, String)>,
    ) {
        let ts = e.timestamp_ms;
        let start = before(ts, duration_ms);
        let run = match self.runs.remove(inv) {
            Some(r) => r,
            None => OpenRun {
                session: session.to_owned(),
                tool: tool.to_owned(),
                tier: None,
                start_ms: start,
                approval: None,
                events: Vec::new(),
                seen: e.position,
            },
        };
        self.emit_run(inv, run, ts, outcome, error);
    }

    fn emit_run(
        &mut self,
        inv: &str,
        run: OpenRun,
        end_ms: i64,
        outcome: &str,
        error: Option<(String, String)>,
    ) {
        let trace_id = id(&["session", &run.session]);
        let span_id = id(&["tool", inv]);
        let call_id = self.calls.remove(inv).unwrap_or_else(|| inv.to_owned());
        let mut attributes = vec![
            ("gen_ai.operation.name".into(), s("execute_tool")),
            ("gen_ai.tool.name".into(), s(&run.tool)),
            ("gen_ai.tool.call.id".into(), Value::Str(call_id)),
            ("gen_ai.tool.type".into(), s("function")),
            ("gen_ai.conversation.id".into(), s(&run.session)),
            ("correx.invocation.id".into(), s(inv)),
            ("correx.outcome".into(), s(outcome)),
        ];
        if let Some(tier) = run.tier {
            attributes.push(("correx.tier".into(), Value::Int(tier.into())));
        }
        let (status, error_type) = match error {
            Some((kind, message)) => (Some(message), Some(kind)),
            None => (None, None),
        };
        if let Some(kind) = error_type {
            attributes.push(("error.type".into(), Value::Str(kind)));
        }
        if let Some(a) = &run.approval {
            self.ready.push(Span {
                trace_id,
                span_id: id(&["approval", inv]),
                parent_span_id: Some(span_id),
                name: format!("approval {}", run.tool),
                kind: SpanKind::Internal,
                start_time_unix_nano: nanos(a.from_ms.min(a.to_ms)),
                end_time_unix_nano: nanos(a.to_ms),
                attributes: vec![
                    ("correx.approval.decision".into(), s(&a.decision)),
                    ("correx.approval.decided_by".into(), s(&a.decided_by)),
                ],
                events: Vec::new(),
                error: None,
            });
        }
        self.ready.push(Span {
            trace_id,
            span_id,
            parent_span_id: None,
            name: format!("execute_tool {}", run.tool),
            kind: SpanKind::Internal,
            start_time_unix_nano: nanos(run.start_ms.min(end_ms)),
            end_time_unix_nano: nanos(end_ms),
            attributes,
            events: run.events,
            error: status,
        });
    }

    fn end_residency(&mut self, model: &str, end_ms: i64, reason: &str) {
        let Some(mut r) = self.residencies.remove(model) else {
            return;
        };
        let failed = matches!(reason, "crashed" | "unresponsive");
        let end_ms = end_ms.max(r.start_ms);
        if failed {
            r.events.push(SpanEvent {
                time_unix_nano: nanos(end_ms),
                name: reason.to_owned(),
                attributes: Vec::new(),
            });
        }
        let mut attributes = vec![
            ("gen_ai.request.model".into(), s(model)),
            ("correx.unload.reason".into(), s(reason)),
        ];
        if let Some(pid) = r.pid {
            attributes.push(("process.pid".into(), Value::Int(pid.into())));
        }
        if let Some(port) = r.port {
            attributes.push(("server.port".into(), Value::Int(port.into())));
        }
        self.ready.push(Span {
            trace_id: r.trace_id,
            span_id: r.span_id,
            parent_span_id: None,
            name: format!("residency {model}"),
            kind: SpanKind::Internal,
            start_time_unix_nano: nanos(r.start_ms.min(end_ms)),
            end_time_unix_nano: nanos(end_ms),
            attributes,
            events: r.events,
            error: failed.then(|| format!("the server {reason}")),
        });
    }

    /// Ends what is still open at the log's last event: runs without an outcome (error "no
    /// outcome recorded") and models still resident, each marked `correx.open`.
    pub fn finish_open(&mut self) {
        let end = self.last_ms;
        let mut runs: Vec<(String, OpenRun)> = self.runs.drain().collect();
        runs.sort_by_key(|(_, r)| r.seen);
        for (inv, run) in runs {
            self.emit_run(
                &inv,
                run,
                end,
                "open",
                Some((
                    "open".into(),
                    "no outcome recorded: still running, or its host died".into(),
                )),
            );
            if let Some(last) = self.ready.last_mut() {
                last.attributes
                    .push(("correx.open".into(), Value::Bool(true)));
            }
        }
        let models: Vec<String> = self.residencies.keys().cloned().collect();
        for model in models {
            self.end_residency(&model, end, "resident");
            if let Some(last) = self.ready.last_mut() {
                last.attributes
                    .push(("correx.open".into(), Value::Bool(true)));
            }
        }
    }
}
