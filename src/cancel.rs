//! [`CancelToken`]: lets another thread stop a blocking call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A flag a blocking call checks while it waits; set it from any thread with
/// [`CancelToken::cancel`]. Clones share the flag.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every call watching this token to stop as soon as it can.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether [`CancelToken::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Clears the flag so the token can be used for the next call.
    pub fn reset(&self) {
        self.0.store(false, Ordering::SeqCst);
    }
}
