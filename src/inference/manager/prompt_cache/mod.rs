//! Sessions' prompt caches, kept across evictions, crashes and restarts.
//!
//! With `models.prompt_cache` set, each spawned chat server gets a save directory of its own
//! (`--slot-save-path`, named by its [`CacheKey`]), and a request that names a session runs
//! pinned to a slot of its own (`id_slot`), so the server reuses the conversation's prefix.
//! After each answer the slot is saved, behind the caller's back, by one saver thread: a
//! server killed later keeps what was saved before. A session's first request to a server that
//! does not hold it restores its latest save first, when that save was made under the same
//! key and its messages are a prefix of the request's; the answer's `timings` then show
//! whether the server reused it (upstream restores have silently done nothing), else the file
//! is dropped. Each outcome is recorded: `model.cache_restored`, `model.cache_missed`,
//! `model.cache_saved`.

mod key;
mod saver;
mod slots;
mod store;

pub(crate) use key::CacheKey;
pub(super) use saver::{SaveJob, Saver};
pub(super) use slots::{Pin, SlotTable};

use super::{LlamaCppInferenceProvider, ModelDescriptor, PromptCacheOptions};
use crate::domain::DomainEvent;
use crate::inference::{InferenceRequest, InferenceResponse};
use crate::text::hex;
use key::Digests;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use store::{Record, Store};

/// Tokens of a restored prefix the server may compute again and the restore still count:
/// the template may render the turn's end differently once it is no longer the last.
const REUSE_SLACK: u64 = 8;

/// A manager's prompt caches: the directory, digests, the saver.
pub(super) struct PromptCache {
    pub options: PromptCacheOptions,
    store: Arc<Store>,
    digests: Digests,
    pub saver: Saver,
}

impl std::fmt::Debug for PromptCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptCache")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// A spawned server's cache: its key and directory, and which session holds which slot.
pub(super) struct ServerCache {
    pub key: CacheKey,
    pub slots: SlotTable,
}

/// What a pinned request found before it was sent.
pub(super) struct Prepared {
    pub slot: u32,
    session: String,
    key: CacheKey,
    prefix: Vec<String>,
    restored: Option<(Record, u64, u64)>,
    /// A save that was not restored, and why.
    pub missed: Option<DomainEvent>,
}

impl PromptCache {
    /// Opens the cache directory and starts the saver.
    ///
    /// # Errors
    /// The directory cannot be made or is not private.
    pub fn open(
        options: PromptCacheOptions,
        events: Arc<dyn crate::events::EventStore>,
    ) -> std::io::Result<PromptCache> {
        let store = Arc::new(Store::open(options.dir())?);
        let digests = Digests::new(store.digests_dir());
        let saver = Saver::start(Arc::clone(&store), events, options.clone());
        Ok(PromptCache {
            options,
            store,
            digests,
            saver,
        })
    }

    /// The key and save directory of a server of `bin` for `d` (reads both files the first
    /// time, a few hundred milliseconds per GiB).
    ///
    /// # Errors
    /// A file cannot be read or the directory made.
    pub fn key_for(&self, d: &ModelDescriptor, bin: &Path) -> std::io::Result<(CacheKey, PathBuf)> {
        let key = CacheKey {
            model_digest: self.digests.of(&d.model_path)?,
            build_digest: self.digests.of(bin)?,
            context_size: d.context_size,
            args: d.extra_args.clone(),
            serves: d.serves.as_str().to_owned(),
        };
        let dir = self.store.key_dir(&key)?;
        Ok((key, dir))
    }

    /// Before a pinned request: restores the session's save into the slot when it may go
    /// there, else says why not (nothing, for a session never saved).
    pub fn prepare(
        &self,
        d: &ModelDescriptor,
        provider: &LlamaCppInferenceProvider,
        pin: Pin,
        request: &InferenceRequest,
    ) -> Prepared {
        let prefix = prefix_of(&super::super::llama::chat_body("", request));
        let mut prepared = Prepared {
            slot: pin.slot,
            session: pin.session,
            key: pin.key,
            prefix,
            restored: None,
            missed: None,
        };
        if pin.warm {
            return prepared;
        }
        let Some(record) = self.store.record(&prepared.session) else {
            return prepared;
        };
        let reason = record
            .key
            .mismatch(&prepared.key)
            .or_else(|| (!prepared.prefix.starts_with(&record.prefix)).then_some("prefix"));
        if let Some(reason) = reason {
            prepared.missed = Some(missed(d, &prepared.session, reason, None));
            return prepared;
        }
        let started = Instant::now();
        let file = Store::file_name(&prepared.session);
        match provider.slot_action(pin.slot, "restore", &file) {
            Ok(v) => {
                let n = v.get("n_restored").and_then(Value::as_u64).unwrap_or(0);
                let ms = started.elapsed().as_millis() as u64;
                self.store.touch(&record);
                prepared.restored = Some((record, n, ms));
            }
            Err(e) => {
                self.store.remove(&prepared.key, &prepared.session);
                prepared.missed = Some(missed(
                    d,
                    &prepared.session,
                    "restore_failed",
                    Some(e.to_string()),
                ));
            }
        }
        prepared
    }

    /// After a pinned request: what its cache did (a restore the answer shows was used, or
    /// not), and, for an answer, the slot queued for saving.
    pub fn settle(
        &self,
        d: &ModelDescriptor,
        provider: &Arc<LlamaCppInferenceProvider>,
        generation: u64,
        prepared: Prepared,
        response: Option<&InferenceResponse>,
    ) -> Option<DomainEvent> {
        let Some(response) = response else {
            return prepared.missed;
        };
        let event = match &prepared.restored {
            None => prepared.missed,
            Some((record, restored, ms)) => {
                let timing = |k: &str| {
                    response
                        .timings
                        .as_ref()
                        .and_then(|t| t.get(k))
                        .and_then(Value::as_u64)
                };
                let reused = timing("cache_n").unwrap_or(0);
                let computed =
                    timing("prompt_n").unwrap_or(u64::from(response.usage.prompt_tokens));
                if reused + REUSE_SLACK >= u64::from(record.prompt_tokens) && reused > 0 {
                    Some(DomainEvent::ModelCacheRestored {
                        model_id: d.model_id.clone(),
                        session_id: prepared.session.clone(),
                        tokens_restored: *restored,
                        tokens_reused: reused,
                        tokens_computed: computed,
                        restore_ms: *ms,
                    })
                } else {
                    // Restored but not used: the file is no good to this server.
                    self.store.remove(&prepared.key, &prepared.session);
                    Some(missed(
                        d,
                        &prepared.session,
                        "not_reused",
                        Some(format!(
                            "restored {restored} tokens; the server reused {reused} and \
                             computed {computed}"
                        )),
                    ))
                }
            }
        };
        self.saver.enqueue(SaveJob {
            generation,
            provider: Arc::clone(provider),
            slot: prepared.slot,
            record: Record {
                session: prepared.session,
                model_id: d.model_id.clone(),
                key: prepared.key,
                prefix: prepared.prefix,
                prompt_tokens: response.usage.prompt_tokens,
                tokens: 0,
                bytes: 0,
                saved_at_ms: 0,
            },
        });
        event
    }
}

fn missed(d: &ModelDescriptor, session: &str, reason: &str, detail: Option<String>) -> DomainEvent {
    DomainEvent::ModelCacheMissed {
        model_id: d.model_id.clone(),
        session_id: session.to_owned(),
        reason: reason.to_owned(),
        detail,
    }
}

/// The digests of what fills a slot, in order: the tools the template renders, then each
/// message. A save may go into a request whose list starts with the save's.
fn prefix_of(body: &Value) -> Vec<String> {
    let digest = |v: &Value| hex(&Sha256::digest(v.to_string().as_bytes())[..16]);
    let mut out = vec![digest(body.get("tools").unwrap_or(&Value::Null))];
    if let Some(messages) = body.get("messages").and_then(Value::as_array) {
        out.extend(messages.iter().map(digest));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_longer_conversation_starts_with_the_shorter_ones_prefix_and_tools_change_it() {
        let one = json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}]});
        let two = json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                                      {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]});
        assert!(prefix_of(&two).starts_with(&prefix_of(&one)));
        let edited = json!({"messages": [{"role": "system", "content": "t"}, {"role": "user", "content": "a"},
                                         {"role": "assistant", "content": "b"}]});
        assert!(!prefix_of(&edited).starts_with(&prefix_of(&one)));
        let mut tools = two.clone();
        tools["tools"] = json!([{"type": "function"}]);
        assert!(!prefix_of(&tools).starts_with(&prefix_of(&one)));
    }
}
