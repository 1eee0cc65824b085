//! Where a remote model's sessions are served. A session new to this process goes to the
//! endpoint of highest rendezvous weight among those holding less than an even share of the
//! sessions placed so far (consistent hashing with bounded loads, as HAProxy's
//! `hash-balance-factor` does for connections, here with no slack), and stays there; while that
//! endpoint cannot take it, its requests go where a new session would, and come back. The
//! placement is this process's: another process, or this one after a restart, places by
//! arrival too (the same endpoint when the load allows it). Plain hashing is balanced only on
//! average: with four conversations on two endpoints it puts three or four on one of them half
//! the time, and a server whose cache keeps two computes every turn of the third again. Placing counts sessions, not requests in flight, because a
//! server's cache holds conversations whether or not they are running right now.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A session unused this long is forgotten: its endpoint has likely reused its cache, and it
/// no longer counts against that endpoint's share.
const IDLE: Duration = Duration::from_secs(30 * 60);

/// At most this many sessions are remembered; beyond, the least recently used are forgotten.
const MOST: usize = 16_384;

/// How often forgotten sessions are swept out.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The sessions placed on a remote model's endpoints (by index).
pub(super) struct Placement {
    placed: HashMap<String, Placed>,
    /// How many remembered sessions each endpoint holds.
    per_endpoint: Vec<usize>,
    swept: Instant,
}

struct Placed {
    endpoint: usize,
    used: Instant,
}

impl Placement {
    pub(super) fn new(endpoints: usize) -> Self {
        Placement {
            placed: HashMap::new(),
            per_endpoint: vec![0; endpoints],
            swept: Instant::now(),
        }
    }

    /// The endpoint for a request of `session`, of `candidates` (the endpoints it may use now,
    /// each with the session's rendezvous weight for it): the session's own when it is a
    /// candidate. A session new here is placed on the highest-weighted candidate holding less
    /// than its share, which becomes its own. A session whose own endpoint is not a candidate
    /// (down, tried and failed, or lacking what the request needs) keeps it: this request
    /// goes where a new session would, and the session's requests go back once its endpoint
    /// is a candidate again, where its cache is.
    pub(super) fn choose(
        &mut self,
        session: &str,
        candidates: &[(usize, u64)],
        now: Instant,
    ) -> Option<usize> {
        self.sweep(now);
        if let Some(p) = self.placed.get_mut(session) {
            p.used = now;
            if candidates.iter().any(|&(i, _)| i == p.endpoint) {
                return Some(p.endpoint);
            }
        }
        // Within share: below the even split of the candidates' sessions plus this one, so
        // some candidate always is.
        let held = |i: usize| self.per_endpoint.get(i).copied().unwrap_or(0);
        let total: usize = candidates.iter().map(|&(i, _)| held(i)).sum();
        let share = (total + 1).div_ceil(candidates.len().max(1));
        let (chosen, _) = candidates
            .iter()
            .filter(|&&(i, _)| held(i) < share)
            .max_by_key(|&&(_, weight)| weight)
            .copied()?;
        if !self.placed.contains_key(session) {
            if self.placed.len() >= MOST {
                self.forget_least_recent();
            }
            self.placed.insert(
                session.to_owned(),
                Placed {
                    endpoint: chosen,
                    used: now,
                },
            );
            if let Some(n) = self.per_endpoint.get_mut(chosen) {
                *n += 1;
            }
        }
        Some(chosen)
    }

    fn forget(&mut self, session: &str) {
        if let Some(p) = self.placed.remove(session) {
            if let Some(n) = self.per_endpoint.get_mut(p.endpoint) {
                *n = n.saturating_sub(1);
            }
        }
    }

    /// Forgets the least recently used eighth of the sessions remembered (a batch, so that a
    /// full table is scanned once per [`MOST`]/8 new sessions, not for each); called when the
    /// table is full.
    fn forget_least_recent(&mut self) {
        let mut by_use: Vec<(Instant, String)> = self
            .placed
            .iter()
            .map(|(k, p)| (p.used, k.clone()))
            .collect();
        let n = (by_use.len() / 8).max(1);
        by_use.select_nth_unstable_by_key(n - 1, |(used, _)| *used);
        for (_, k) in &by_use[..n] {
            self.forget(k);
        }
    }

    /// Forgets sessions idle longer than [`IDLE`], at most once a [`SWEEP_EVERY`].
    fn sweep(&mut self, now: Instant) {
        if now.saturating_duration_since(self.swept) < SWEEP_EVERY {
            return;
        }
        self.swept = now;
        let idle: Vec<String> = self
            .placed
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.used) >= IDLE)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &idle {
            self.forget(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Candidates 0..n with weights that prefer endpoint `favourite` for every session.
    fn all(n: usize, favourite: usize) -> Vec<(usize, u64)> {
        (0..n)
            .map(|i| (i, if i == favourite { 10 } else { i as u64 }))
            .collect()
    }

    #[test]
    fn sessions_that_all_prefer_one_endpoint_are_spread_evenly() {
        let mut p = Placement::new(2);
        let now = Instant::now();
        let chosen: Vec<usize> = (0..4)
            .map(|s| p.choose(&format!("s{s}"), &all(2, 0), now))
            .collect::<Option<_>>()
            .expect("an endpoint each");
        assert_eq!(chosen, [0, 1, 0, 1]);
        // Each keeps its endpoint afterwards, whatever its weights say.
        for (s, was) in chosen.iter().enumerate() {
            assert_eq!(p.choose(&format!("s{s}"), &all(2, 0), now), Some(*was));
        }
    }

    #[test]
    fn a_session_whose_endpoint_is_away_goes_elsewhere_and_comes_back() {
        let mut p = Placement::new(3);
        let now = Instant::now();
        assert_eq!(p.choose("s", &all(3, 0), now), Some(0));
        // Endpoint 0 is down (or failed this request): the request goes to the best of the
        // others, the session stays placed on 0 and counts there only.
        assert_eq!(p.choose("s", &[(1, 1), (2, 2)], now), Some(2));
        assert_eq!(p.per_endpoint, [1, 0, 0]);
        // Back: so is the session.
        assert_eq!(p.choose("s", &all(3, 0), now), Some(0));
    }

    #[test]
    fn a_full_table_forgets_its_least_recently_used_eighth() {
        let mut p = Placement::new(2);
        let start = Instant::now();
        for n in 0..MOST {
            let at = start + Duration::from_millis(n as u64);
            p.choose(&format!("s{n}"), &all(2, 0), at);
        }
        assert_eq!(p.placed.len(), MOST);
        let later = start + Duration::from_millis(MOST as u64);
        p.choose("one more", &all(2, 0), later);
        assert_eq!(p.placed.len(), MOST - MOST / 8 + 1);
        assert!(!p.placed.contains_key("s0"), "the oldest is forgotten");
        assert!(p.placed.contains_key(&format!("s{}", MOST - 1)));
        assert_eq!(p.per_endpoint.iter().sum::<usize>(), p.placed.len());
    }

    #[test]
    fn idle_sessions_are_forgotten_and_free_their_share() {
        let mut p = Placement::new(2);
        let start = Instant::now();
        p.choose("old", &all(2, 0), start);
        let later = start + IDLE + SWEEP_EVERY;
        // "old" is forgotten, so "new" may take endpoint 0 (its favourite) and "newer" too
        // would exceed the share: it goes to 1.
        assert_eq!(p.choose("new", &all(2, 0), later), Some(0));
        assert_eq!(p.choose("newer", &all(2, 0), later), Some(1));
        assert_eq!(p.placed.len(), 2);
        assert_eq!(p.per_endpoint, [1, 1]);
    }

    #[test]
    fn no_candidate_means_no_endpoint() {
        let mut p = Placement::new(2);
        assert_eq!(p.choose("s", &[], Instant::now()), None);
        assert!(p.placed.is_empty());
    }
}
