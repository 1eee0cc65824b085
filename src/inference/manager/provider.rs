//! [`ManagedInferenceProvider`]: inference on a managed model, counted in flight and recorded.

use super::*;
use crate::inference::Embeddings;

/// Wraps the loaded model's provider: reloads it if residency unloaded it, counts inferences in
/// flight, applies DYNAMIC and EPHEMERAL residency after each, and records `InferenceCompleted`.
pub struct ManagedInferenceProvider {
    manager: Weak<Inner>,
    descriptor: ModelDescriptor,
    id: ProviderId,
    tokenizer: ManagedTokenizer,
}

/// The tokenizer of whichever server serves the model now; with none loaded, `tokenize`
/// fails and `count` approximates characters / 4, so nothing goes to another listener.
#[derive(Debug)]
struct ManagedTokenizer {
    manager: Weak<Inner>,
    model_id: String,
}

impl ManagedTokenizer {
    fn current(&self) -> Option<LlamaCppTokenizer> {
        let inner = self.manager.upgrade()?;
        let st = inner.state.lock();
        st.models.get(&self.model_id).and_then(Running::tokenizer)
    }
}

impl Tokenizer for ManagedTokenizer {
    fn tokenize(&self, text: &str) -> Result<Vec<i64>, InferenceError> {
        match self.current() {
            Some(t) => t.tokenize(text),
            None => Err(InferenceError::ModelUnavailable {
                detail: format!("{} is not loaded; load it before tokenizing", self.model_id),
            }),
        }
    }

    fn count(&self, text: &str) -> usize {
        match self.current() {
            Some(t) => t.count(text),
            None => text.chars().count() / 4,
        }
    }
}

impl std::fmt::Debug for ManagedInferenceProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedInferenceProvider")
            .field("model_id", &self.descriptor.model_id)
            .finish_non_exhaustive()
    }
}

impl ManagedInferenceProvider {
    pub(super) fn new(manager: Weak<Inner>, descriptor: ModelDescriptor) -> Self {
        let tokenizer = ManagedTokenizer {
            manager: manager.clone(),
            model_id: descriptor.model_id.clone(),
        };
        ManagedInferenceProvider {
            id: ProviderId::from_string(format!("llama-cpp:{}", descriptor.model_id)),
            tokenizer,
            manager,
            descriptor,
        }
    }

    /// The descriptor this provider serves.
    pub fn descriptor(&self) -> &ModelDescriptor {
        &self.descriptor
    }

    /// Runs one inference, reloading the model first if needed; `cancel` stops the load or the
    /// generation (the connection closes, so the server stops decoding).
    ///
    /// # Errors
    /// As [`InferenceProvider::infer`]; a failed reload is [`InferenceError::ModelUnavailable`].
    pub fn infer_with_cancel(
        &self,
        request: &InferenceRequest,
        cancel: &CancelToken,
    ) -> Result<InferenceResponse, InferenceError> {
        // Nobody sees the pieces: a remote answer cut off midway may start again elsewhere.
        self.run(request, cancel, &mut |_| StreamControl::Continue, true)
    }

    /// Embeds `inputs` (one vector each, in order) on this model, reloading it first if
    /// needed, and records `embedding.completed`; `cancel` stops the load or the call.
    ///
    /// # Errors
    /// [`InferenceError::NotServed`] for a model whose descriptor does not say `"serves":
    /// "embeddings"`; [`InferenceError::InvalidInput`]; otherwise as
    /// [`InferenceProvider::infer`].
    pub fn embed(
        &self,
        inputs: &[String],
        cancel: &CancelToken,
    ) -> Result<Embeddings, InferenceError> {
        self.check_serves(ModelRole::Embeddings)?;
        super::super::embedding::check_inputs(inputs)?;
        let inner = self.inner()?;
        let (target, flight, _) = self.begin(&inner, None, cancel)?;
        let result = match &target {
            Target::Local(p) => p.embed(inputs, cancel),
            Target::Remote(_) => Err(self.not_served(ModelRole::Embeddings)),
        }
        .map(|mut e| {
            e.model = self.descriptor.model_id.clone();
            e
        });
        let event = result
            .as_ref()
            .ok()
            .map(|e| DomainEvent::EmbeddingCompleted {
                model_id: self.descriptor.model_id.clone(),
                inputs: e.vectors.len() as u32,
                prompt_tokens: e.prompt_tokens,
                dimensions: e.vectors.first().map_or(0, |v| v.len() as u32),
                latency_ms: e.latency_ms,
            });
        // Recorded before the caller sees the vectors.
        flight.finish(event);
        result
    }

    fn not_served(&self, needs: ModelRole) -> InferenceError {
        InferenceError::NotServed {
            model_id: self.descriptor.model_id.clone(),
            needs: needs.as_str().into(),
            serves: self.descriptor.serves.as_str().into(),
        }
    }

    fn check_serves(&self, needs: ModelRole) -> Result<(), InferenceError> {
        if self.descriptor.serves == needs {
            Ok(())
        } else {
            Err(self.not_served(needs))
        }
    }

    fn inner(&self) -> Result<Arc<Inner>, InferenceError> {
        self.manager
            .upgrade()
            .ok_or_else(|| InferenceError::ModelUnavailable {
                detail: ModelLoadError::ManagerGone.to_string(),
            })
    }

    /// Loads the model if it is not, and counts one call in flight on it; a `session`'s
    /// call on a server with a prompt cache gets the session's slot.
    fn begin<'a>(
        &'a self,
        inner: &'a Arc<Inner>,
        session: Option<&str>,
        cancel: &CancelToken,
    ) -> Result<(Target, InFlight<'a>, Option<prompt_cache::Pin>), InferenceError> {
        let mut st = inner.state.lock();
        ensure_loaded(inner, &mut st, &self.descriptor, cancel).map_err(|e| match e {
            ModelLoadError::Cancelled => InferenceError::Cancelled,
            other => InferenceError::ModelUnavailable {
                detail: other.to_string(),
            },
        })?;
        let uses = st.touch();
        let r = st
            .models
            .get_mut(&self.descriptor.model_id)
            .ok_or_else(|| InferenceError::ModelUnavailable {
                detail: "the model vanished while loading".into(),
            })?;
        r.in_flight += 1;
        r.idle = None;
        r.last_used = uses;
        let pin = match (session, r.cache.as_mut()) {
            (Some(s), Some(c)) => c.slots.pin(s, &c.key, uses),
            _ => None,
        };
        let flight = InFlight {
            inner,
            descriptor: &self.descriptor,
            generation: r.generation,
            slot: pin.as_ref().map(|p| p.slot),
            finished: false,
        };
        Ok((r.target(), flight, pin))
    }

    fn run(
        &self,
        request: &InferenceRequest,
        cancel: &CancelToken,
        on_chunk: &mut dyn FnMut(StreamChunk<'_>) -> StreamControl,
        restartable: bool,
    ) -> Result<InferenceResponse, InferenceError> {
        self.check_serves(ModelRole::Chat)?;
        let inner = self.inner()?;
        // The call runs on this thread: a cancel shuts its socket, so it returns at once and
        // the server stops generating; no worker is left behind.
        let (target, flight, pin) = self.begin(&inner, request.session.as_deref(), cancel)?;
        let (result, endpoint) = match (&target, pin, &inner.cache) {
            (Target::Local(p), Some(pin), Some(cache)) => {
                let prepared = cache.prepare(&self.descriptor, p, pin, request);
                let result = p.infer_stream_pinned(request, prepared.slot, cancel, on_chunk);
                let settled = cache.settle(
                    &self.descriptor,
                    p,
                    flight.generation,
                    prepared,
                    result.as_ref().ok(),
                );
                // While the call is in flight, so before its completion and any unload.
                if let Some(event) = settled {
                    if let Err(e) = append_domain(inner.events.as_ref(), MODEL_STREAM, &event) {
                        log::error!("recording a prompt cache outcome: {e}");
                    }
                }
                (result, None)
            }
            (Target::Local(p), _, _) => (p.infer_stream(request, cancel, on_chunk), None),
            (Target::Remote(set), _, _) => match set.infer_stream(
                inner.events.as_ref(),
                request,
                cancel,
                on_chunk,
                restartable,
            ) {
                Ok((r, url)) => (Ok(r), Some(url)),
                Err(e) => (Err(e), None),
            },
        };
        let result = result.map(|mut r| {
            r.model = self.descriptor.model_id.clone();
            r.endpoint = endpoint.clone();
            r
        });
        // Recorded before the caller sees the answer.
        flight.finish(inference_event(&self.descriptor, &result, endpoint));
        result
    }
}

/// One inference in flight: counted while it lives; its bookkeeping runs when it ends, also
/// when a stream callback panics.
pub(super) struct InFlight<'a> {
    inner: &'a Inner,
    descriptor: &'a ModelDescriptor,
    generation: u64,
    /// The prompt-cache slot the call is pinned to.
    slot: Option<u32>,
    finished: bool,
}

impl InFlight<'_> {
    /// Ends the call: `event` (for a call that succeeded) is recorded first.
    fn finish(mut self, event: Option<DomainEvent>) {
        self.finished = true;
        finish_call(
            self.inner,
            self.descriptor,
            self.generation,
            self.slot,
            event,
        );
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.finished {
            finish_call(
                self.inner,
                self.descriptor,
                self.generation,
                self.slot,
                None,
            );
        }
    }
}

/// What a finished inference records: `inference.completed`, for one that succeeded.
fn inference_event(
    descriptor: &ModelDescriptor,
    result: &Result<InferenceResponse, InferenceError>,
    endpoint: Option<String>,
) -> Option<DomainEvent> {
    result
        .as_ref()
        .ok()
        .map(|r| DomainEvent::InferenceCompleted {
            model_id: descriptor.model_id.clone(),
            usage: r.usage,
            latency_ms: r.latency_ms,
            finish_reason: r.finish_reason.as_str().to_owned(),
            endpoint,
        })
}

/// After any call on a model (an inference, an embedding): `event` (for a call that
/// succeeded), the in-flight count, and the residency policy (the latest load's, which is this
/// provider's unless another load of the id changed it since).
fn finish_call(
    inner: &Inner,
    descriptor: &ModelDescriptor,
    generation: u64,
    slot: Option<u32>,
    event: Option<DomainEvent>,
) {
    let id = descriptor.model_id.as_str();
    // The completion is appended while the call still counts as in flight, so an unload
    // or eviction (which waits for that count) is after it in the log, and while it counts as
    // being recorded, so a crash's unload (which waits for no inference) is after it too. No
    // lock is held across the disk write. A server already recorded as gone gets no
    // completion after its unload: the log would say the model was still loaded.
    let recording = event.is_some() && {
        let mut st = inner.state.lock();
        match st.models.get_mut(id).filter(|r| r.generation == generation) {
            Some(r) => {
                r.recording += 1;
                true
            }
            None => false,
        }
    };
    if let (true, Some(event)) = (recording, event) {
        // A store that panics must not leave the count of records in progress up: every stop
        // of this model would wait for it.
        let appended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            append_domain(inner.events.as_ref(), MODEL_STREAM, &event)
        }));
        match appended {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => log::error!("recording a call on {id}: {e}"),
            Err(_) => log::error!("recording a call on {id}: the event store panicked"),
        }
    }
    let mut st = inner.state.lock();
    let mut residency = None;
    if let Some(r) = st.models.get_mut(id).filter(|r| r.generation == generation) {
        if recording {
            r.recording -= 1;
        }
        r.in_flight = r.in_flight.saturating_sub(1);
        if let (Some(slot), Some(cache)) = (slot, r.cache.as_mut()) {
            cache.slots.unpin(slot);
        }
        if r.in_flight == 0 {
            residency = Some((r.descriptor.residency, r.descriptor.idle_timeout));
        }
    }
    inner.settled.notify_all();
    match residency {
        Some((ResidencyMode::Dynamic, timeout)) => {
            if let Some(r) = st.models.get_mut(id) {
                r.idle = Some(Instant::now() + timeout);
            }
            inner.timer.notify_all();
        }
        Some((ResidencyMode::Ephemeral, _)) => {
            if let Err(e) = stop_model(inner, &mut st, id, UnloadReason::Ephemeral) {
                log::error!("ephemeral unload: {e}");
            }
        }
        Some((ResidencyMode::Persistent, _)) | None => {}
    }
}

impl InferenceProvider for ManagedInferenceProvider {
    fn id(&self) -> &ProviderId {
        &self.id
    }

    fn infer(&self, request: &InferenceRequest) -> Result<InferenceResponse, InferenceError> {
        self.infer_with_cancel(request, &CancelToken::new())
    }

    fn infer_stream(
        &self,
        request: &InferenceRequest,
        cancel: &CancelToken,
        on_chunk: &mut dyn FnMut(StreamChunk<'_>) -> StreamControl,
    ) -> Result<InferenceResponse, InferenceError> {
        self.run(request, cancel, on_chunk, false)
    }

    fn health_check(&self) -> ProviderHealth {
        let Some(inner) = self.manager.upgrade() else {
            return ProviderHealth::Unhealthy {
                reason: "the model manager was dropped".into(),
            };
        };
        let target = inner
            .state
            .lock()
            .models
            .get(&self.descriptor.model_id)
            .map(Running::target);
        match target {
            Some(Target::Local(p)) => p.health_check(),
            Some(Target::Remote(set)) => match set.check_all(&CancelToken::new()) {
                Ok(()) => ProviderHealth::Healthy,
                Err(reason) => ProviderHealth::Unhealthy { reason },
            },
            None => ProviderHealth::Unhealthy {
                reason: format!("{} is not loaded", self.descriptor.model_id),
            },
        }
    }

    fn capabilities(&self) -> Vec<CapabilityScore> {
        capabilities_for(&self.descriptor.model_id)
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &self.tokenizer
    }
}
