//! How long appends take, counted as they return: a histogram of fixed buckets in atomics, so
//! recording costs an appender two clock reads and two atomic adds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in seconds: 50 µs to 1 s.
pub const APPEND_BOUNDS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Append latencies so far.
#[derive(Debug)]
pub(crate) struct AppendLatency {
    counts: [AtomicU64; APPEND_BOUNDS.len() + 1],
    sum_ns: AtomicU64,
}

impl Default for AppendLatency {
    fn default() -> Self {
        AppendLatency {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

/// A copy of the histogram: counts per bucket (the last for `+Inf`, not cumulative) and the
/// sum in seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencySnapshot {
    /// The buckets' upper bounds, in seconds.
    pub bounds: &'static [f64],
    /// Appends in each bucket, one more for above the last bound.
    pub counts: Vec<u64>,
    /// The sum of every latency, in seconds.
    pub sum_seconds: f64,
}

impl AppendLatency {
    pub(crate) fn record(&self, took: Duration) {
        let s = took.as_secs_f64();
        let i = APPEND_BOUNDS
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(APPEND_BOUNDS.len());
        if let Some(c) = self.counts.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_ns.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub(crate) fn snapshot(&self) -> LatencySnapshot {
        LatencySnapshot {
            bounds: APPEND_BOUNDS,
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            sum_seconds: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}
