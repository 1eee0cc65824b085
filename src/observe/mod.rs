//! Observability: the log and the live runtime as Prometheus metrics (`metrics`,
//! `prometheus`), and the log as OpenTelemetry traces ([`otlp`]).
//!
//! Everything counted comes from the log (a fold over its events, so `correx metrics DB` on a
//! log alone says the same as the runtime that wrote it), except what only a live runtime
//! knows: the models resident now and how long appends take.

mod metrics;
pub mod otlp;
mod prometheus;

pub use metrics::LogMetrics;
pub use prometheus::{Exposition, Histogram};

use crate::events::LatencySnapshot;

/// What only a live runtime knows, for [`render`].
#[derive(Clone, Debug)]
pub struct LiveMetrics {
    /// Models loaded now, by the model manager.
    pub resident_models: usize,
    /// Inferences running now, per model.
    pub in_flight: Vec<(String, u32)>,
    /// The event store's append latencies.
    pub append_latency: LatencySnapshot,
    /// The live OTLP exporter's counts, when one runs.
    pub otlp: Option<otlp::ExportStats>,
}

/// The Prometheus text exposition of `log`, and of `live` when given.
pub fn render(log: &LogMetrics, live: Option<&LiveMetrics>) -> String {
    let mut x = Exposition::default();
    log.render(&mut x, live.map(|l| l.resident_models));
    if let Some(live) = live {
        x.family(
            "correx_model_in_flight",
            "gauge",
            "Inferences running now, by model.",
        );
        for (model, n) in &live.in_flight {
            x.sample("correx_model_in_flight", &[("model", model)], f64::from(*n));
        }
        x.family(
            "correx_log_append_duration_seconds",
            "histogram",
            "Time from an append's call to its return (its commit's flush included).",
        );
        x.histogram(
            "correx_log_append_duration_seconds",
            &[],
            &Histogram {
                bounds: live.append_latency.bounds,
                counts: live.append_latency.counts.clone(),
                sum: live.append_latency.sum_seconds,
            },
        );
    }
    if let Some(stats) = live.and_then(|l| l.otlp) {
        for (name, help, v) in [
            (
                "correx_otlp_spans_exported_total",
                "Spans the OTLP receiver accepted.",
                stats.exported,
            ),
            (
                "correx_otlp_spans_dropped_total",
                "Spans dropped: the export queue was full, or their request failed.",
                stats.dropped,
            ),
            (
                "correx_otlp_failed_requests_total",
                "OTLP requests that failed, each try.",
                stats.failed_requests,
            ),
            (
                "correx_otlp_follow_errors_total",
                "Times the OTLP exporter failed to read the log (it tries again after a second).",
                stats.follow_errors,
            ),
        ] {
            x.family(name, "counter", help);
            x.sample(name, &[], v as f64);
        }
    }
    x.finish()
}
