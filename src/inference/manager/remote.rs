//! Remote models: llama-servers already running elsewhere, named by URL. Nothing is spawned or
//! killed; each request goes to the healthy endpoint with the fewest requests in flight, and
//! moves to the next when one fails before answering (recorded as `model.endpoint_failover`).

use super::*;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

pub(super) struct RemoteEndpoint {
    pub(super) url: String,
    provider: LlamaCppInferenceProvider,
    tokenizer: LlamaCppTokenizer,
    in_flight: AtomicU32,
    healthy: AtomicBool,
}

/// A remote model's endpoints and their state, shared by the requests running on them.
pub(super) struct EndpointSet {
    model_id: String,
    pub(super) endpoints: Vec<RemoteEndpoint>,
}

/// Counts a request on an endpoint while it lives.
struct Using<'a>(&'a RemoteEndpoint);

impl Drop for Using<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Failures after which another endpoint may succeed: nothing answered, or the server failed.
fn worth_another(e: &InferenceError) -> bool {
    matches!(
        e,
        InferenceError::ConnectionRefused { .. }
            | InferenceError::Timeout { .. }
            | InferenceError::Transport { .. }
            | InferenceError::StreamInterrupted { .. }
    ) || matches!(e, InferenceError::Http { status, .. } if *status >= 500)
}

impl EndpointSet {
    pub(super) fn new(d: &ModelDescriptor, http: &HttpOptions) -> Self {
        let endpoints = d
            .endpoints
            .iter()
            .map(|url| {
                let base = url.trim_end_matches('/');
                RemoteEndpoint {
                    url: base.to_owned(),
                    provider: LlamaCppInferenceProvider::new(&d.model_id, base, http),
                    tokenizer: LlamaCppTokenizer::new(base, http),
                    in_flight: AtomicU32::new(0),
                    healthy: AtomicBool::new(true),
                }
            })
            .collect();
        EndpointSet {
            model_id: d.model_id.clone(),
            endpoints,
        }
    }

    /// Health-checks every endpoint (blocking, one HTTP call each), keeping the results;
    /// `Err` with what each answered when none is healthy.
    pub(super) fn check_all(&self) -> Result<(), String> {
        let mut failures = Vec::new();
        for e in &self.endpoints {
            let health = e.provider.health_check();
            let ok = matches!(health, ProviderHealth::Healthy);
            e.healthy.store(ok, Ordering::Release);
            if let ProviderHealth::Unhealthy { reason } = health {
                failures.push(format!("{}: {reason}", e.url));
            }
        }
        if failures.len() == self.endpoints.len() {
            Err(failures.join("; "))
        } else {
            Ok(())
        }
    }

    /// The endpoint to try next: healthy ones first, then the fewest in flight; `None` when
    /// every endpoint was tried.
    fn pick(&self, tried: &[usize]) -> Option<usize> {
        (0..self.endpoints.len())
            .filter(|i| !tried.contains(i))
            .min_by_key(|&i| {
                let e = &self.endpoints[i];
                (
                    !e.healthy.load(Ordering::Acquire),
                    e.in_flight.load(Ordering::Acquire),
                )
            })
    }

    /// The tokenizer of the endpoint a request would go to now.
    pub(super) fn tokenizer(&self) -> Option<LlamaCppTokenizer> {
        self.pick(&[]).map(|i| self.endpoints[i].tokenizer.clone())
    }

    pub(super) fn status(&self) -> Vec<EndpointStatus> {
        self.endpoints
            .iter()
            .map(|e| EndpointStatus {
                url: e.url.clone(),
                healthy: e.healthy.load(Ordering::Acquire),
                in_flight: e.in_flight.load(Ordering::Acquire),
            })
            .collect()
    }

    /// Runs the request on one endpoint after another until one answers. A request that
    /// already streamed text to a caller who sees the pieces (`restartable` false) is not
    /// repeated elsewhere, since the caller would see them twice: its error is returned.
    pub(super) fn infer_stream(
        &self,
        events: &dyn EventStore,
        request: &InferenceRequest,
        cancel: &CancelToken,
        on_chunk: &mut dyn FnMut(StreamChunk<'_>) -> StreamControl,
        restartable: bool,
    ) -> Result<InferenceResponse, InferenceError> {
        let mut tried = Vec::new();
        let Some(mut at) = self.pick(&tried) else {
            return Err(InferenceError::ModelUnavailable {
                detail: format!("model {} has no endpoints", self.model_id),
            });
        };
        loop {
            tried.push(at);
            let endpoint = &self.endpoints[at];
            endpoint.in_flight.fetch_add(1, Ordering::AcqRel);
            let using = Using(endpoint);
            let mut delivered = false;
            let result = endpoint
                .provider
                .infer_stream(request, cancel, &mut |chunk| {
                    delivered = true;
                    on_chunk(chunk)
                });
            drop(using);
            let err = match result {
                Ok(r) => {
                    endpoint.healthy.store(true, Ordering::Release);
                    return Ok(r);
                }
                Err(e) => e,
            };
            if cancel.is_cancelled() || !worth_another(&err) {
                return Err(err);
            }
            endpoint.healthy.store(false, Ordering::Release);
            let next = self.pick(&tried);
            let (false, Some(next)) = (delivered && !restartable, next) else {
                return Err(err);
            };
            let event = DomainEvent::ModelEndpointFailover {
                model_id: self.model_id.clone(),
                from: endpoint.url.clone(),
                to: self.endpoints[next].url.clone(),
                error: crate::text::bounded(err.to_string()),
            };
            if let Err(e) = append_domain(events, MODEL_STREAM, &event) {
                log::error!("recording a failover: {e}");
            }
            log::warn!(
                "model {}: {} failed ({err}); trying {}",
                self.model_id,
                endpoint.url,
                self.endpoints[next].url
            );
            at = next;
        }
    }
}
