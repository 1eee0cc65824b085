//! Remote models: llama-servers already running elsewhere, named by URL. Nothing is spawned or
//! killed. A request of a session goes to the session's endpoint (placed by rendezvous hashing
//! with bounded loads, [`super::placement`]: its highest-weighted healthy endpoint unless that
//! one holds more than its share of the sessions; it stays there, so its prompt cache is
//! reused, and while its endpoint is down only its own requests go elsewhere), unless that one
//! has `session_spill_in_flight` requests running; any other request goes to the healthy endpoint
//! with the fewest in flight. A request moves to the next endpoint when one fails before
//! answering (recorded as `model.endpoint_failover`). Each endpoint is probed for what it
//! offers once it first answers its health check ([`LlamaCppInferenceProvider::probe`]); a
//! request that needs what an endpoint lacks (a JSON schema, tokenizing) goes to one that
//! has it, or fails with `Unsupported` before anything is sent.

use super::placement::Placement;
use super::*;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

pub(super) struct RemoteEndpoint {
    pub(super) url: String,
    provider: LlamaCppInferenceProvider,
    tokenizer: LlamaCppTokenizer,
    in_flight: AtomicU32,
    healthy: AtomicBool,
    /// What the probe found, once it answered its health check.
    probed: parking_lot::Mutex<Probe>,
}

/// How long a failed probe waits before the endpoint is probed again.
const PROBE_RETRY: Duration = Duration::from_secs(60);

/// Where an endpoint's probe stands.
enum Probe {
    /// It has not answered a health check yet.
    Unprobed,
    /// A check is probing it now (no other starts meanwhile).
    Probing,
    /// What it offers, and its tokenizer when it tokenizes.
    Done(EndpointFeatures, Option<LlamaCppTokenizer>),
    /// Why it cannot serve the model; probed again from `retry_at`.
    Failed { reason: String, retry_at: Instant },
}

impl RemoteEndpoint {
    fn features(&self) -> Option<EndpointFeatures> {
        match &*self.probed.lock() {
            Probe::Done(f, _) => Some(f.clone()),
            _ => None,
        }
    }

    /// Probes it if it is due (a first answer, or a failure's retry time passed) and no
    /// other check is probing it; what keeps it from serving, if anything.
    fn probe_if_due(&self, cancel: &CancelToken) -> Result<(), String> {
        {
            let mut p = self.probed.lock();
            match &*p {
                Probe::Done(..) => return Ok(()),
                Probe::Probing => return Err("being probed".into()),
                Probe::Failed { reason, retry_at } if Instant::now() < *retry_at => {
                    return Err(reason.clone())
                }
                Probe::Unprobed | Probe::Failed { .. } => *p = Probe::Probing,
            }
        }
        let found = self.provider.probe(cancel);
        let mut p = self.probed.lock();
        match found {
            Ok(features) => {
                let tokenizer = features
                    .tokenize
                    .then(|| self.provider.probed_tokenizer())
                    .flatten();
                *p = Probe::Done(features, tokenizer);
                Ok(())
            }
            Err(reason) => {
                log::warn!("endpoint {}: {reason}", self.url);
                *p = Probe::Failed {
                    reason: reason.clone(),
                    retry_at: Instant::now() + PROBE_RETRY,
                };
                Err(reason)
            }
        }
    }
}

/// A remote model's endpoints and their state, shared by the requests running on them.
pub(super) struct EndpointSet {
    model_id: String,
    pub(super) endpoints: Vec<RemoteEndpoint>,
    /// A session's endpoint with this many requests in flight takes no more of them.
    spill_at: u32,
    /// Which endpoint each session is served by.
    placement: parking_lot::Mutex<Placement>,
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
    pub(super) fn new(d: &ModelDescriptor, http: &HttpOptions, spill_at: u32) -> Self {
        let endpoints: Vec<RemoteEndpoint> = d
            .endpoints
            .iter()
            .map(|url| {
                let base = url.trim_end_matches('/');
                // Checked present when the descriptor was validated, just before.
                let key = d.api_key_env.as_ref().and_then(|v| std::env::var(v).ok());
                let (provider, tokenizer) = match d.endpoint_kind {
                    EndpointKind::LlamaServer => {
                        let p = LlamaCppInferenceProvider::new(&d.model_id, base, http)
                            .with_api_key(key.as_deref(), http);
                        let t = p.tokenizer_handle();
                        (p, t)
                    }
                    EndpointKind::Openai => (
                        LlamaCppInferenceProvider::openai(
                            &d.model_id,
                            base,
                            http,
                            d.served_model.as_deref(),
                            key.as_deref(),
                        ),
                        LlamaCppTokenizer::unsupported(http),
                    ),
                };
                RemoteEndpoint {
                    url: base.to_owned(),
                    provider,
                    tokenizer,
                    in_flight: AtomicU32::new(0),
                    healthy: AtomicBool::new(true),
                    probed: parking_lot::Mutex::new(Probe::Unprobed),
                }
            })
            .collect();
        EndpointSet {
            model_id: d.model_id.clone(),
            placement: parking_lot::Mutex::new(Placement::new(endpoints.len())),
            endpoints,
            spill_at,
        }
    }

    /// Health-checks every endpoint (blocking, one HTTP call each; an endpoint that answers
    /// for the first time, or whose failed probe is due again, is probed too, giving up when
    /// `cancel` is set), keeping the results; `Err` with what each answered when none is
    /// healthy.
    pub(super) fn check_all(&self, cancel: &CancelToken) -> Result<(), String> {
        let mut failures = Vec::new();
        for e in &self.endpoints {
            let mut health = e.provider.health_check();
            if matches!(health, ProviderHealth::Healthy) {
                if let Err(reason) = e.probe_if_due(cancel) {
                    health = ProviderHealth::Unhealthy { reason };
                }
            }
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

    /// The endpoint to try next, of those not `tried`: `session`'s (placed among the healthy
    /// ones, [`Placement::choose`]) unless it is at the spill bound, else healthy ones first,
    /// then the fewest in flight; `None` when every endpoint was tried.
    fn pick(&self, tried: &[usize], session: Option<&str>) -> Option<usize> {
        let untried = || (0..self.endpoints.len()).filter(|i| !tried.contains(i));
        let healthy = |i: &usize| self.endpoints[*i].healthy.load(Ordering::Acquire);
        let in_flight = |i: usize| self.endpoints[i].in_flight.load(Ordering::Acquire);
        if let Some(key) = session {
            let candidates: Vec<(usize, u64)> = untried()
                .filter(healthy)
                .map(|i| (i, rendezvous_weight(key, &self.endpoints[i].url)))
                .collect();
            let own = self
                .placement
                .lock()
                .choose(key, &candidates, Instant::now());
            if let Some(own) = own.filter(|&i| in_flight(i) < self.spill_at) {
                return Some(own);
            }
        }
        untried().min_by_key(|&i| (!healthy(&i), in_flight(i)))
    }

    /// The tokenizer of the endpoint a request would go to now, of those found to tokenize
    /// (else of any: its tokenizer refuses, or approximates a count).
    pub(super) fn tokenizer(&self) -> Option<LlamaCppTokenizer> {
        let probed = |i: usize| match &*self.endpoints[i].probed.lock() {
            Probe::Done(_, t) => t.clone(),
            _ => None,
        };
        let without: Vec<usize> = (0..self.endpoints.len())
            .filter(|&i| probed(i).is_none())
            .collect();
        match self.pick(&without, None) {
            Some(i) => probed(i),
            None => self
                .pick(&[], None)
                .map(|i| self.endpoints[i].tokenizer.clone()),
        }
    }

    /// Each endpoint's URL and what its probe found, or why there is nothing yet.
    pub(super) fn features(&self) -> Vec<(String, Result<EndpointFeatures, String>)> {
        self.endpoints
            .iter()
            .map(|e| {
                let found = match &*e.probed.lock() {
                    Probe::Done(f, _) => Ok(f.clone()),
                    Probe::Failed { reason, .. } => Err(reason.clone()),
                    Probe::Unprobed | Probe::Probing => {
                        Err("it has not answered its health check".to_owned())
                    }
                };
                (e.url.clone(), found)
            })
            .collect()
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

    /// Runs the request on one endpoint after another until one answers, and says which did. A
    /// request that already streamed text to a caller who sees the pieces (`restartable`
    /// false) is not repeated elsewhere, since the caller would see them twice: its error is
    /// returned.
    pub(super) fn infer_stream(
        &self,
        events: &dyn EventStore,
        request: &InferenceRequest,
        cancel: &CancelToken,
        on_chunk: &mut dyn FnMut(StreamChunk<'_>) -> StreamControl,
        restartable: bool,
    ) -> Result<(InferenceResponse, String), InferenceError> {
        let session = request.session.as_deref();
        // Endpoints known to lack what the request needs are never tried.
        let needs_schema = matches!(
            request.config.response_format,
            Some(ResponseFormat::JsonSchema { .. })
        );
        let mut tried: Vec<usize> = (0..self.endpoints.len())
            .filter(|&i| {
                needs_schema && self.endpoints[i].features().is_some_and(|f| !f.json_schema)
            })
            .collect();
        let Some(mut at) = self.pick(&tried, session) else {
            if !tried.is_empty() {
                return Err(InferenceError::Unsupported {
                    feature: "response_format json_schema".into(),
                    endpoint_kind: self.endpoints[tried[0]].provider.kind().as_str().into(),
                });
            }
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
                    return Ok((r, endpoint.url.clone()));
                }
                Err(e) => e,
            };
            if cancel.is_cancelled() || !worth_another(&err) {
                return Err(err);
            }
            endpoint.healthy.store(false, Ordering::Release);
            let next = self.pick(&tried, session);
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

/// A session's weight for an endpoint: the endpoint of highest weight serves the session.
/// FNV-1a over both (so every host and every build of correx agrees), then a 64-bit finalizer
/// to spread nearby inputs.
fn rendezvous_weight(session: &str, url: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in session.bytes().chain([0xff]).chain(url.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(urls: &[&str], spill_at: u32) -> EndpointSet {
        let mut d = ModelDescriptor::new("m", "", ResidencyMode::Persistent);
        d.endpoints = urls.iter().map(|u| (*u).to_owned()).collect();
        EndpointSet::new(&d, &HttpOptions::default(), spill_at)
    }

    #[test]
    fn a_session_keeps_its_endpoint_and_sessions_spread() {
        let urls = [
            "http://10.0.0.1:8080",
            "http://10.0.0.2:8080",
            "http://10.0.0.3:8080",
        ];
        let s = set(&urls, 4);
        let mut per_endpoint = [0usize; 3];
        for n in 0..300 {
            let key = format!("session-{n}");
            let first = s.pick(&[], Some(&key)).expect("an endpoint");
            assert_eq!(
                s.pick(&[], Some(&key)),
                Some(first),
                "the same key, another pick"
            );
            per_endpoint[first] += 1;
        }
        // Placing with bounded loads spreads them evenly.
        assert_eq!(per_endpoint, [100, 100, 100]);
    }

    #[test]
    fn losing_an_endpoint_moves_only_its_sessions() {
        let urls = ["http://a:1", "http://b:1", "http://c:1"];
        let s = set(&urls, 4);
        let before: Vec<usize> = (0..200)
            .map(|n| s.pick(&[], Some(&format!("k{n}"))).expect("an endpoint"))
            .collect();
        s.endpoints[1].healthy.store(false, Ordering::Release);
        for (n, was) in before.iter().enumerate() {
            let now = s.pick(&[], Some(&format!("k{n}"))).expect("an endpoint");
            if *was != 1 {
                assert_eq!(now, *was, "a session of a healthy endpoint moved");
            } else {
                assert_ne!(now, 1);
            }
        }
        // A failover passes over the endpoint tried, to the session's next one.
        let key = (0..)
            .map(|n| format!("k{n}"))
            .find(|k| s.pick(&[], Some(k)) == Some(0));
        let key = key.expect("a session on endpoint 0");
        assert_eq!(s.pick(&[0], Some(&key)), Some(2));
    }

    #[test]
    fn a_busy_session_endpoint_spills_to_the_least_loaded() {
        let s = set(&["http://a:1", "http://b:1"], 2);
        let key = "busy";
        let own = s.pick(&[], Some(key)).expect("an endpoint");
        s.endpoints[own].in_flight.store(1, Ordering::Release);
        assert_eq!(s.pick(&[], Some(key)), Some(own), "under the bound");
        s.endpoints[own].in_flight.store(2, Ordering::Release);
        assert_eq!(s.pick(&[], Some(key)), Some(1 - own), "at the bound");
        // Without a session: the fewest in flight, as before.
        assert_eq!(s.pick(&[], None), Some(1 - own));
    }
}
