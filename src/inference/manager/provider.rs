//! [`ManagedInferenceProvider`]: inference on a managed model, counted in flight and recorded.

use super::*;

/// Wraps the loaded model's provider: reloads it if residency unloaded it, counts inferences in
/// flight, applies DYNAMIC and EPHEMERAL residency after each, and records `InferenceCompleted`.
pub struct ManagedInferenceProvider {
    manager: Weak<Inner>,
    descriptor: ModelDescriptor,
    id: ProviderId,
    tokenizer: LlamaCppTokenizer,
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
        let tokenizer = match manager.upgrade() {
            Some(i) => i.tokenizer.clone(),
            None => LlamaCppTokenizer::new("http://127.0.0.1:0", &HttpOptions::default()),
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
        self.infer_stream(request, cancel, &mut |_| StreamControl::Continue)
    }
}

/// One inference in flight: counted while it lives; its bookkeeping runs when it ends, also
/// when a stream callback panics.
pub(super) struct InFlight<'a> {
    inner: &'a Inner,
    descriptor: &'a ModelDescriptor,
    generation: u64,
    finished: bool,
}

impl InFlight<'_> {
    fn finish(mut self, result: &Result<InferenceResponse, InferenceError>) {
        self.finished = true;
        finish_inference(self.inner, self.descriptor, self.generation, result);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.finished {
            finish_inference(
                self.inner,
                self.descriptor,
                self.generation,
                &Err(InferenceError::Cancelled),
            );
        }
    }
}

/// After an inference: the in-flight count, the event, and the residency policy.
pub(super) fn finish_inference(
    inner: &Inner,
    descriptor: &ModelDescriptor,
    generation: u64,
    result: &Result<InferenceResponse, InferenceError>,
) {
    let mut st = inner.state.lock();
    st.in_flight = st.in_flight.saturating_sub(1);
    if st.in_flight == 0 {
        inner.settled.notify_all();
    }
    if let Ok(r) = result {
        let event = DomainEvent::InferenceCompleted {
            model_id: descriptor.model_id.clone(),
            usage: r.usage,
            latency_ms: r.latency_ms,
            finish_reason: r.finish_reason.as_str().to_owned(),
        };
        if let Err(e) = append_domain(inner.events.as_ref(), MODEL_STREAM, &event) {
            log::error!("recording an inference: {e}");
        }
    }
    let ours = st.current.as_ref().map(|r| r.generation) == Some(generation);
    if ours && st.in_flight == 0 {
        match descriptor.residency {
            ResidencyMode::Persistent => {}
            ResidencyMode::Dynamic => {
                st.idle = Some((Instant::now() + descriptor.idle_timeout, generation));
                inner.timer.notify_all();
            }
            ResidencyMode::Ephemeral => {
                if let Err(e) = unload_locked(inner, &mut st, UnloadReason::Ephemeral) {
                    log::error!("ephemeral unload: {e}");
                }
            }
        }
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
        let inner = self
            .manager
            .upgrade()
            .ok_or_else(|| InferenceError::ModelUnavailable {
                detail: ModelLoadError::ManagerGone.to_string(),
            })?;
        let (provider, generation) = {
            let mut st = inner.state.lock();
            load_locked(&inner, &mut st, &self.descriptor, cancel).map_err(|e| match e {
                ModelLoadError::Cancelled => InferenceError::Cancelled,
                other => InferenceError::ModelUnavailable {
                    detail: other.to_string(),
                },
            })?;
            let r = st
                .current
                .as_ref()
                .ok_or_else(|| InferenceError::ModelUnavailable {
                    detail: "the model vanished while loading".into(),
                })?;
            let picked = (r.provider.clone(), r.generation);
            st.in_flight += 1;
            st.idle = None;
            picked
        };
        // The call runs on this thread: a cancel shuts its socket, so it returns at once and
        // the server stops generating; no worker is left behind.
        let flight = InFlight {
            inner: &inner,
            descriptor: &self.descriptor,
            generation,
            finished: false,
        };
        let result = provider
            .infer_stream(request, cancel, on_chunk)
            .map(|mut r| {
                r.model = self.descriptor.model_id.clone();
                r
            });
        // Recorded before the caller sees the answer.
        flight.finish(&result);
        result
    }

    fn health_check(&self) -> ProviderHealth {
        let Some(inner) = self.manager.upgrade() else {
            return ProviderHealth::Unhealthy {
                reason: "the model manager was dropped".into(),
            };
        };
        let provider = {
            let st = inner.state.lock();
            match st.current.as_ref() {
                Some(r) if r.descriptor.model_id == self.descriptor.model_id => r.provider.clone(),
                _ => {
                    return ProviderHealth::Unhealthy {
                        reason: format!("{} is not loaded", self.descriptor.model_id),
                    }
                }
            }
        };
        provider.health_check()
    }

    fn capabilities(&self) -> Vec<CapabilityScore> {
        capabilities_for(&self.descriptor.model_id)
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &self.tokenizer
    }
}
