//! The housekeeping thread: DYNAMIC idle unloads, and liveness checks of every loaded server.

use super::*;

/// Runs until the manager shuts down: unloads DYNAMIC models whose idle deadline passed with
/// nothing in flight, and every `liveness_interval` health-checks the loaded servers (lock
/// released), killing a spawned one that failed [`LIVENESS_MISSES`] checks in a row.
pub(super) fn housekeeper(weak: Weak<Inner>) {
    let Some(inner) = weak.upgrade() else { return };
    let interval = inner
        .options
        .liveness_interval
        .max(Duration::from_millis(10));
    let mut next_check = Instant::now() + interval;
    let mut st = inner.state.lock();
    loop {
        if st.shutdown {
            return;
        }
        let now = Instant::now();
        let expired: Vec<String> = st
            .models
            .iter()
            .filter(|(_, r)| r.in_flight == 0 && r.idle.is_some_and(|at| at <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            if let Some(r) = st.models.get_mut(&id) {
                r.idle = None;
            }
            if let Err(e) = stop_model(&inner, &mut st, &id, UnloadReason::Idle) {
                log::error!("idle unload of {id}: {e}");
            }
        }
        if Instant::now() >= next_check {
            check_liveness(&inner, &mut st);
            next_check = Instant::now() + interval;
            continue;
        }
        let wake = st
            .models
            .values()
            .filter_map(|r| r.idle)
            .min()
            .map_or(next_check, |at| at.min(next_check));
        inner.timer.wait_until(&mut st, wake);
    }
}

fn check_liveness(inner: &Inner, st: &mut MutexGuard<'_, State>) {
    let probes: Vec<(String, u64, Target)> = st
        .models
        .iter()
        .map(|(id, r)| (id.clone(), r.generation, r.target()))
        .collect();
    if probes.is_empty() {
        return;
    }
    let results: Vec<(String, u64, bool)> = MutexGuard::unlocked(st, || {
        probes
            .into_iter()
            .filter_map(|(id, generation, probe)| match probe {
                Target::Local(p) => {
                    let ok = matches!(p.health_check(), ProviderHealth::Healthy);
                    Some((id, generation, ok))
                }
                Target::Remote(set) => {
                    // Endpoints only change whether requests prefer them.
                    let _ = set.check_all(&CancelToken::new());
                    None
                }
            })
            .collect()
    });
    for (id, generation, ok) in results {
        let Some(r) = st.models.get_mut(&id) else {
            continue;
        };
        if r.generation != generation {
            continue;
        }
        if ok {
            r.misses = 0;
            continue;
        }
        r.misses += 1;
        if r.misses >= LIVENESS_MISSES {
            log::warn!(
                "llama-server for {id} failed {} health checks in a row; killing it",
                r.misses
            );
            if let Err(e) = stop_model(inner, st, &id, UnloadReason::Unresponsive) {
                log::error!("unloading unresponsive {id}: {e}");
            }
        }
    }
}
