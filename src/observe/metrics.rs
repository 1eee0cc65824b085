//! Metrics from the log: a fold over its events, updated from where it stopped, rendered as
//! Prometheus text beside what only the live runtime knows.

use super::prometheus::{Exposition, Histogram, SECONDS};
use crate::domain::DomainEvent;
use crate::events::{EventStore, RecordedEvent, Result};
use std::collections::BTreeMap;

/// Model loads take seconds to minutes.
const LOAD_SECONDS: &[f64] = &[0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

/// What the log says, folded: counters and histograms by their labels.
#[derive(Clone, Debug, Default)]
pub struct LogMetrics {
    /// The last position folded.
    position: u64,
    events: u64,
    /// Events of a type correx knows whose payload did not decode.
    undecodable: u64,
    tool_runs: BTreeMap<(String, &'static str), u64>,
    tool_durations: BTreeMap<String, Histogram>,
    approvals: BTreeMap<(String, String), u64>,
    approval_waits: BTreeMap<String, Histogram>,
    network_denials: BTreeMap<(String, String), u64>,
    inferences: BTreeMap<(String, String), u64>,
    inference_durations: BTreeMap<String, Histogram>,
    input_tokens: BTreeMap<String, u64>,
    output_tokens: BTreeMap<String, u64>,
    loads: BTreeMap<String, u64>,
    load_durations: BTreeMap<String, Histogram>,
    unloads: BTreeMap<(String, &'static str), u64>,
    /// Per model: loaded without an unload after it, as the log tells.
    resident: BTreeMap<String, bool>,
    jobs_started: u64,
    jobs_exited: BTreeMap<String, u64>,
    session_steps: BTreeMap<(String, &'static str), u64>,
}

fn bump<K: Ord>(map: &mut BTreeMap<K, u64>, key: K, by: u64) {
    *map.entry(key).or_insert(0) += by;
}

fn observe(map: &mut BTreeMap<String, Histogram>, key: &str, bounds: &'static [f64], v: f64) {
    map.entry(key.to_owned())
        .or_insert_with(|| Histogram::new(bounds))
        .observe(v);
}

fn seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

impl LogMetrics {
    /// The last position folded in.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Folds in every event after [`LogMetrics::position`], page by page.
    ///
    /// # Errors
    /// The store's, reading.
    pub fn update(&mut self, store: &dyn EventStore) -> Result<()> {
        loop {
            // The store caps a page at its own size.
            let page = store.read_all(self.position + 1, 1000)?;
            if page.is_empty() {
                return Ok(());
            }
            for e in &page {
                self.fold(e);
            }
        }
    }

    /// Folds in one event.
    pub fn fold(&mut self, e: &RecordedEvent) {
        self.position = self.position.max(e.position);
        self.events += 1;
        let d = match e.domain() {
            Ok(Some(d)) => d,
            Ok(None) => return,
            Err(_) => {
                self.undecodable += 1;
                return;
            }
        };
        // Every type is named here, so a new one is a compile error until it is placed; each
        // group's handler matches only the types routed to it.
        match d {
            d @ (DomainEvent::ToolExecutionCompleted { .. }
            | DomainEvent::ToolExecutionCancelled { .. }
            | DomainEvent::ToolExecutionFailed { .. }
            | DomainEvent::ToolExecutionRejected { .. }
            | DomainEvent::ToolExecutionInterrupted { .. }
            | DomainEvent::ToolApprovalDecided { .. }
            | DomainEvent::ToolNetworkDenied { .. }) => self.fold_tool_event(d),
            // A staged run's change set is in its outcome already.
            DomainEvent::WorkspaceStaged { .. } | DomainEvent::WorkspaceSettled { .. } => {}
            // Input tokens, as OpenTelemetry counts an embeddings call's.
            DomainEvent::EmbeddingCompleted {
                model_id,
                prompt_tokens,
                ..
            } => bump(&mut self.input_tokens, model_id, prompt_tokens.into()),
            d @ (DomainEvent::InferenceCompleted { .. }
            | DomainEvent::ModelLoaded { .. }
            | DomainEvent::ModelUnloaded { .. }) => self.fold_model_event(d),
            DomainEvent::JobStarted { .. } => self.jobs_started += 1,
            DomainEvent::JobExited { reason, .. } => bump(&mut self.jobs_exited, reason, 1),
            DomainEvent::SessionStepCompleted { kind, .. } => {
                bump(&mut self.session_steps, (kind, "completed"), 1)
            }
            DomainEvent::SessionStepFailed { kind, .. } => {
                bump(&mut self.session_steps, (kind, "failed"), 1)
            }
            DomainEvent::ModelEndpointFailover { .. }
            | DomainEvent::ModelCacheRestored { .. }
            | DomainEvent::ModelCacheMissed { .. }
            | DomainEvent::ModelCacheSaved { .. }
            | DomainEvent::ToolExecutionStarted { .. }
            | DomainEvent::McpServerStarted { .. }
            | DomainEvent::McpServerExited { .. }
            | DomainEvent::McpRequestRefused { .. }
            | DomainEvent::McpToolsPinned { .. }
            | DomainEvent::McpToolHeld { .. }
            | DomainEvent::ToolProgress { .. }
            // Its decision is counted, with the time it waited.
            | DomainEvent::ToolApprovalRequested { .. }
            | DomainEvent::SessionStepStarted { .. }
            | DomainEvent::SessionWaiting { .. }
            | DomainEvent::SessionSignaled { .. } => {}
        }
    }

    /// A tool run's outcome, approval or network denial.
    fn fold_tool_event(&mut self, d: DomainEvent) {
        match d {
            DomainEvent::ToolExecutionCompleted {
                tool_name,
                duration_ms,
                ..
            } => {
                observe(
                    &mut self.tool_durations,
                    &tool_name,
                    SECONDS,
                    seconds(duration_ms),
                );
                bump(&mut self.tool_runs, (tool_name, "completed"), 1);
            }
            DomainEvent::ToolExecutionCancelled {
                tool_name,
                duration_ms,
                ..
            } => {
                observe(
                    &mut self.tool_durations,
                    &tool_name,
                    SECONDS,
                    seconds(duration_ms),
                );
                bump(&mut self.tool_runs, (tool_name, "cancelled"), 1);
            }
            DomainEvent::ToolExecutionFailed { tool_name, .. } => {
                bump(&mut self.tool_runs, (tool_name, "failed"), 1)
            }
            DomainEvent::ToolExecutionRejected { tool_name, .. } => {
                bump(&mut self.tool_runs, (tool_name, "rejected"), 1)
            }
            DomainEvent::ToolExecutionInterrupted { tool_name, .. } => {
                bump(&mut self.tool_runs, (tool_name, "interrupted"), 1)
            }
            DomainEvent::ToolApprovalDecided {
                tool_name,
                decision,
                wait_ms,
                ..
            } => {
                observe(
                    &mut self.approval_waits,
                    &tool_name,
                    SECONDS,
                    seconds(wait_ms),
                );
                bump(&mut self.approvals, (tool_name, decision), 1);
            }
            DomainEvent::ToolNetworkDenied {
                tool_name, reason, ..
            } => bump(&mut self.network_denials, (tool_name, reason), 1),
            // `fold` routes no other type here.
            _ => {}
        }
    }

    /// An inference, or a model's load or unload.
    fn fold_model_event(&mut self, d: DomainEvent) {
        match d {
            DomainEvent::InferenceCompleted {
                model_id,
                usage,
                latency_ms,
                finish_reason,
                ..
            } => {
                observe(
                    &mut self.inference_durations,
                    &model_id,
                    SECONDS,
                    seconds(latency_ms),
                );
                bump(
                    &mut self.input_tokens,
                    model_id.clone(),
                    usage.prompt_tokens.into(),
                );
                bump(
                    &mut self.output_tokens,
                    model_id.clone(),
                    usage.completion_tokens.into(),
                );
                bump(&mut self.inferences, (model_id, finish_reason), 1);
            }
            DomainEvent::ModelLoaded {
                model_id, load_ms, ..
            } => {
                observe(
                    &mut self.load_durations,
                    &model_id,
                    LOAD_SECONDS,
                    seconds(load_ms),
                );
                self.resident.insert(model_id.clone(), true);
                bump(&mut self.loads, model_id, 1);
            }
            DomainEvent::ModelUnloaded {
                model_id, reason, ..
            } => {
                self.resident.insert(model_id.clone(), false);
                bump(&mut self.unloads, (model_id, reason.as_str()), 1);
            }
            // `fold` routes no other type here.
            _ => {}
        }
    }

    /// How many models the log says are resident (loaded, not unloaded since).
    pub fn resident_models(&self) -> usize {
        self.resident.values().filter(|r| **r).count()
    }

    /// Writes every family the log tells of. `resident` is the live count of resident
    /// models when a runtime knows it; otherwise the log's.
    pub fn render(&self, x: &mut Exposition, resident: Option<usize>) {
        self.render_log_families(x);
        self.render_tool_families(x);
        self.render_inference_families(x);
        self.render_model_families(x, resident);
        self.render_job_and_session_families(x);
    }

    /// The log's own: events read, position, undecodable events.
    fn render_log_families(&self, x: &mut Exposition) {
        x.family(
            "correx_log_events_total",
            "counter",
            "Events in the log, read up to correx_log_position.",
        );
        x.sample("correx_log_events_total", &[], self.events as f64);
        x.family(
            "correx_log_position",
            "gauge",
            "The log's last position read.",
        );
        x.sample("correx_log_position", &[], self.position as f64);
        x.family(
            "correx_log_undecodable_events_total",
            "counter",
            "Events of a type correx knows whose payload did not decode (correx log verify names them).",
        );
        x.sample(
            "correx_log_undecodable_events_total",
            &[],
            self.undecodable as f64,
        );
    }

    /// Tool runs, their durations, approvals and network denials.
    fn render_tool_families(&self, x: &mut Exposition) {
        counters2(
            x,
            "correx_tool_runs_total",
            "Tool runs ended, by tool and outcome (completed, failed, cancelled, rejected, interrupted).",
            ("tool", "outcome"),
            &self.tool_runs,
        );
        histograms(
            x,
            "correx_tool_run_duration_seconds",
            "Duration of tool runs that completed or were cancelled, by tool.",
            "tool",
            &self.tool_durations,
        );
        counters2(
            x,
            "correx_tool_approvals_total",
            "Approval decisions, by tool and decision.",
            ("tool", "decision"),
            &self.approvals,
        );
        histograms(
            x,
            "correx_tool_approval_wait_seconds",
            "Time from a run's approval request to its decision, by tool.",
            "tool",
            &self.approval_waits,
        );
        counters2(
            x,
            "correx_tool_network_denials_total",
            "Connections a confined run was refused, by tool and reason.",
            ("tool", "reason"),
            &self.network_denials,
        );
    }

    /// Inferences, their latencies and tokens.
    fn render_inference_families(&self, x: &mut Exposition) {
        counters2(
            x,
            "correx_inferences_total",
            "Inferences completed, by model and finish reason.",
            ("model", "finish_reason"),
            &self.inferences,
        );
        histograms(
            x,
            "correx_inference_duration_seconds",
            "Latency of completed inferences, by model.",
            "model",
            &self.inference_durations,
        );
        counters1(
            x,
            "correx_inference_input_tokens_total",
            "Prompt tokens of completed inferences, by model.",
            "model",
            &self.input_tokens,
        );
        counters1(
            x,
            "correx_inference_output_tokens_total",
            "Generated tokens of completed inferences, by model.",
            "model",
            &self.output_tokens,
        );
    }

    /// Model loads, their durations, unloads and the resident count.
    fn render_model_families(&self, x: &mut Exposition, resident: Option<usize>) {
        counters1(
            x,
            "correx_model_loads_total",
            "Model loads that passed their health check, by model.",
            "model",
            &self.loads,
        );
        histograms(
            x,
            "correx_model_load_duration_seconds",
            "Time from a load's start to its server's health, by model.",
            "model",
            &self.load_durations,
        );
        counters2(
            x,
            "correx_model_unloads_total",
            "Model unloads, by model and reason (evicted: evictions; crashed: crashes; \
             requested, idle, ephemeral, replaced, unresponsive).",
            ("model", "reason"),
            &self.unloads,
        );
        x.family("correx_models_resident", "gauge", "Models loaded now.");
        let resident = resident.unwrap_or_else(|| self.resident_models());
        x.sample("correx_models_resident", &[], resident as f64);
    }

    /// Background jobs and durable session steps.
    fn render_job_and_session_families(&self, x: &mut Exposition) {
        x.family(
            "correx_jobs_started_total",
            "counter",
            "Background jobs started.",
        );
        x.sample("correx_jobs_started_total", &[], self.jobs_started as f64);
        counters1(
            x,
            "correx_jobs_exited_total",
            "Background jobs ended, by reason.",
            "reason",
            &self.jobs_exited,
        );
        counters2(
            x,
            "correx_session_steps_total",
            "Durable session steps recorded, by kind and outcome (completed, failed).",
            ("kind", "outcome"),
            &self.session_steps,
        );
    }
}

fn counters1(x: &mut Exposition, name: &str, help: &str, label: &str, m: &BTreeMap<String, u64>) {
    x.family(name, "counter", help);
    for (k, v) in m {
        x.sample(name, &[(label, k)], *v as f64);
    }
}

fn counters2<B: AsRef<str>>(
    x: &mut Exposition,
    name: &str,
    help: &str,
    labels: (&str, &str),
    m: &BTreeMap<(String, B), u64>,
) {
    x.family(name, "counter", help);
    for ((a, b), v) in m {
        x.sample(name, &[(labels.0, a), (labels.1, b.as_ref())], *v as f64);
    }
}

fn histograms(
    x: &mut Exposition,
    name: &str,
    help: &str,
    label: &str,
    m: &BTreeMap<String, Histogram>,
) {
    x.family(name, "histogram", help);
    for (k, h) in m {
        x.histogram(name, &[(label, k)], h);
    }
}
