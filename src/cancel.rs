//! [`CancelToken`]: lets another thread stop a blocking call.
//!
//! A call that blocks in the kernel (a socket read while llama-server decodes a long prompt)
//! cannot poll a flag. It registers a wake-up with [`CancelToken::on_cancel`] instead: cancelling
//! runs the wake-up (for an HTTP call, a `shutdown` of its socket), so the call returns at once
//! and the server sees the connection close.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

type Wake = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Shared {
    cancelled: AtomicBool,
    next_hook: AtomicU64,
    hooks: Mutex<Vec<(u64, Wake)>>,
}

/// A flag a blocking call checks while it waits; set it from any thread with
/// [`CancelToken::cancel`]. Clones share the flag.
#[derive(Clone, Default)]
pub struct CancelToken(Arc<Shared>);

impl std::fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelToken")
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every call watching this token to stop as soon as it can. Never blocks for long:
    /// the wake-ups it runs are a syscall each.
    pub fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    /// Runs (and drops) every registered wake-up.
    fn wake_all(&self) {
        let hooks = std::mem::take(&mut *self.0.hooks.lock());
        for (_, wake) in hooks {
            wake();
        }
    }

    /// Whether [`CancelToken::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::SeqCst)
    }

    /// Clears the flag so the token can be used for the next call.
    pub fn reset(&self) {
        self.0.cancelled.store(false, Ordering::SeqCst);
    }

    /// Runs `wake` when the token is cancelled while the returned guard lives; at once when it
    /// is cancelled already. Dropping the guard unregisters `wake` without running it.
    pub(crate) fn on_cancel(&self, wake: impl FnOnce() + Send + 'static) -> CancelHook {
        let id = self.0.next_hook.fetch_add(1, Ordering::Relaxed);
        self.0.hooks.lock().push((id, Box::new(wake)));
        // A cancel between the push and this check has run (or is running) the hook; one
        // after it finds the hook registered. Either way the wake-up is not lost.
        if self.is_cancelled() {
            self.wake_all();
        }
        CancelHook {
            shared: Arc::clone(&self.0),
            id,
        }
    }
}

/// Keeps a wake-up registered; see [`CancelToken::on_cancel`].
pub(crate) struct CancelHook {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for CancelHook {
    fn drop(&mut self) {
        self.shared.hooks.lock().retain(|(id, _)| *id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn hooks_run_once_on_cancel_and_not_after_their_guard_is_dropped() {
        let t = CancelToken::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&runs);
        let kept = t.on_cancel(move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        let r = Arc::clone(&runs);
        drop(t.on_cancel(move || {
            r.fetch_add(100, Ordering::SeqCst);
        }));
        t.cancel();
        t.cancel();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        drop(kept);
        let r = Arc::clone(&runs);
        let _late = t.on_cancel(move || {
            r.fetch_add(10, Ordering::SeqCst);
        });
        assert_eq!(
            runs.load(Ordering::SeqCst),
            11,
            "registered after cancel: runs at once"
        );
    }
}
