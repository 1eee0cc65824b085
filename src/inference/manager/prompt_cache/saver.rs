//! The saver: one thread per manager that saves slots after their answers, so no caller waits
//! for a save. A server is stopped only after its queued saves are done ([`Saver::flush`]),
//! so an eviction, an unload or a close saves on the way out; a server that dies keeps what
//! was saved before.

use super::store::{Record, Store};
use crate::domain::{append_domain, DomainEvent, MODEL_STREAM};
use crate::events::EventStore;
use crate::inference::manager::PromptCacheOptions;
use crate::inference::LlamaCppInferenceProvider;
use parking_lot::{Condvar, Mutex};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

/// One slot to save.
pub(in crate::inference::manager) struct SaveJob {
    /// The server's generation (what [`Saver::flush`] waits for).
    pub generation: u64,
    pub provider: Arc<LlamaCppInferenceProvider>,
    pub slot: u32,
    /// What the save will hold (counts filled in from the server's answer).
    pub record: Record,
}

#[derive(Default)]
struct Pending {
    by_generation: Mutex<HashMap<u64, usize>>,
    done: Condvar,
    /// Servers whose queued saves are dropped.
    discarded: Mutex<std::collections::HashSet<u64>>,
}

pub(in crate::inference::manager) struct Saver {
    tx: Mutex<Option<mpsc::Sender<SaveJob>>>,
    pending: Arc<Pending>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Saver {
    pub fn start(
        store: Arc<Store>,
        events: Arc<dyn EventStore>,
        caps: PromptCacheOptions,
    ) -> Saver {
        let (tx, rx) = mpsc::channel::<SaveJob>();
        let pending = Arc::new(Pending::default());
        let seen = Arc::clone(&pending);
        let thread = std::thread::Builder::new()
            .name("correx-cache-saver".into())
            .spawn(move || {
                for job in rx {
                    let generation = job.generation;
                    if !seen.discarded.lock().contains(&generation) {
                        // A save that panics must not leave its count up: a stop of its
                        // server waits for that count.
                        let saved = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            save(&store, events.as_ref(), &caps, job)
                        }));
                        if saved.is_err() {
                            log::error!(
                                "a prompt cache save panicked; its server keeps its older save"
                            );
                        }
                    }
                    let mut by = seen.by_generation.lock();
                    if let Some(n) = by.get_mut(&generation) {
                        *n -= 1;
                        if *n == 0 {
                            by.remove(&generation);
                        }
                    }
                    seen.done.notify_all();
                }
            })
            .map_err(|e| log::error!("could not start the prompt cache saver: {e}"))
            .ok();
        Saver {
            tx: Mutex::new(thread.is_some().then_some(tx)),
            pending,
            thread: Mutex::new(thread),
        }
    }

    /// Queues a save.
    pub fn enqueue(&self, job: SaveJob) {
        let tx = self.tx.lock();
        let Some(tx) = tx.as_ref() else { return };
        let generation = job.generation;
        *self
            .pending
            .by_generation
            .lock()
            .entry(generation)
            .or_default() += 1;
        if tx.send(job).is_err() {
            let mut by = self.pending.by_generation.lock();
            by.remove(&generation);
        }
    }

    /// Waits until the saves queued for the server of `generation` are done.
    pub fn flush(&self, generation: u64) {
        let mut by = self.pending.by_generation.lock();
        while by.contains_key(&generation) {
            self.pending.done.wait(&mut by);
        }
    }

    /// Drops the saves queued for the server of `generation`.
    pub fn discard(&self, generation: u64) {
        self.pending.discarded.lock().insert(generation);
    }

    /// Finishes the queued saves and ends the thread.
    pub fn close(&self) {
        self.tx.lock().take();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

/// Saves one slot, records it, and keeps the caps.
fn save(store: &Store, events: &dyn EventStore, caps: &PromptCacheOptions, job: SaveJob) {
    let SaveJob {
        provider,
        slot,
        mut record,
        ..
    } = job;
    let started = Instant::now();
    let file = Store::file_name(&record.session);
    let answer = match provider.slot_action(slot, "save", &file) {
        Ok(v) => v,
        Err(e) => {
            // A server that died or was stopped takes no save; its last one stays.
            log::debug!("saving {}'s slot {slot}: {e}", record.model_id);
            return;
        }
    };
    let count = |k: &str| answer.get(k).and_then(Value::as_u64).unwrap_or(0);
    record.tokens = count("n_saved") as u32;
    record.bytes = count("n_written");
    let save_ms = started.elapsed().as_millis() as u64;
    if let Some(old) = store.record(&record.session) {
        if old.key.id() != record.key.id() {
            // One save per session: the one under another model's key is no longer its.
            store.remove(&old.key, &record.session);
        }
    }
    if let Err(e) = store.put(record.clone()) {
        log::warn!("recording {}'s saved prompt cache: {e}", record.model_id);
        store.remove(&record.key, &record.session);
        return;
    }
    let removed = store.enforce(caps);
    for r in &removed {
        log::debug!(
            "prompt cache cap: removed {} bytes under {}",
            r.bytes,
            r.key_id
        );
    }
    let event = DomainEvent::ModelCacheSaved {
        model_id: record.model_id.clone(),
        session_id: record.session.clone(),
        tokens: u64::from(record.tokens),
        bytes: record.bytes,
        save_ms,
        files_removed: removed.len() as u32,
        bytes_removed: removed.iter().map(|r| r.bytes).sum(),
    };
    if let Err(e) = append_domain(events, MODEL_STREAM, &event) {
        log::error!("recording a prompt cache save: {e}");
    }
}
