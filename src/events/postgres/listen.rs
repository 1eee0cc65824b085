//! Hearing of other processes' commits: one connection per store `LISTEN`s on
//! `correx_events`, and every notification wakes the store's subscriptions.

use super::location::Target;
use crate::events::subscription::Wake;
use postgres::fallible_iterator::FallibleIterator;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the listening thread waits for a notification before it looks at its stop flag:
/// what dropping a store may wait for it.
const TICK: Duration = Duration::from_millis(50);
/// The wait before reconnecting a lost listening connection, doubled to at most `MAX_BACKOFF`.
const BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The listening thread; stopped (and joined) when the store is dropped.
pub(super) struct Listener {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    pub(super) fn start(target: Target, wake: Arc<Wake>) -> Listener {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("correx-pg-listen".into())
            .spawn(move || listen(&target, &wake, &flag))
            .ok();
        if thread.is_none() {
            log::warn!("cannot start the event log's listening thread; subscriptions poll");
        }
        Listener { stop, thread }
    }

    pub(super) fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn listen(target: &Target, wake: &Wake, stop: &AtomicBool) {
    let mut backoff = BACKOFF;
    while !stop.load(Ordering::Relaxed) {
        let mut client = match target
            .connect()
            // Listening, then holding the lock that tells writers someone listens, for
            // the session (see `sql::LISTENERS_LOCK`).
            .and_then(|mut c| {
                match c.batch_execute(&format!(
                    "LISTEN correx_events; SELECT pg_advisory_lock_shared({})",
                    super::sql::LISTENERS_LOCK
                )) {
                    Ok(()) => Ok(c),
                    Err(e) => Err(super::pg_error("listen")(e)),
                }
            }) {
            Ok(c) => c,
            Err(e) => {
                // Until the backoff is full: not every two seconds of an outage.
                if backoff < MAX_BACKOFF {
                    log::warn!("event log subscriptions cannot listen ({e}); retrying");
                }
                // In ticks, so a store dropped meanwhile is not kept waiting.
                let until = std::time::Instant::now() + backoff;
                while std::time::Instant::now() < until && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = BACKOFF;
        // Whatever was committed while no connection listened is read now.
        wake.bump();
        'connected: while !stop.load(Ordering::Relaxed) {
            let lost = {
                let mut notifications = client.notifications();
                let mut heard = notifications.timeout_iter(TICK);
                loop {
                    match heard.next() {
                        Ok(Some(_)) => wake.bump(),
                        Err(_) => break true,
                        Ok(None) => break false,
                    }
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                }
            };
            if lost {
                break 'connected;
            }
            if client.is_closed() {
                break;
            }
        }
    }
}
