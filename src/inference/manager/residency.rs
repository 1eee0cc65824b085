//! DYNAMIC residency: the idle timer thread.

use super::*;

/// Unloads a DYNAMIC model when its idle deadline passes with nothing in flight.
pub(super) fn idle_timer(weak: Weak<Inner>) {
    let Some(inner) = weak.upgrade() else { return };
    let mut st = inner.state.lock();
    loop {
        if st.shutdown {
            return;
        }
        match st.idle {
            None => {
                inner.timer.wait(&mut st);
            }
            Some((deadline, _)) if Instant::now() < deadline => {
                inner.timer.wait_until(&mut st, deadline);
            }
            Some((_, generation)) => {
                st.idle = None;
                let current = st.current.as_ref().map(|r| r.generation);
                if current == Some(generation) && st.in_flight == 0 {
                    if let Err(e) = unload_locked(&inner, &mut st, UnloadReason::Idle) {
                        log::error!("idle unload: {e}");
                    }
                }
            }
        }
    }
}
