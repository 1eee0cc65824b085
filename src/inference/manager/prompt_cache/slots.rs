//! Which session holds which slot of one server: a session keeps its slot while it talks;
//! a session new to the server takes a free slot, else the least recently used one nothing
//! runs on (its conversation was saved after its last answer).

use super::CacheKey;

#[derive(Debug, Default, Clone)]
struct Slot {
    session: Option<String>,
    /// Requests running on it.
    busy: u32,
    used: u64,
}

/// A server's slots.
#[derive(Debug)]
pub(in crate::inference::manager) struct SlotTable {
    slots: Vec<Slot>,
}

/// A request's slot, and whether its session already holds it.
#[derive(Debug)]
pub(in crate::inference::manager) struct Pin {
    pub slot: u32,
    pub warm: bool,
    pub session: String,
    pub key: CacheKey,
}

impl SlotTable {
    /// `count` slots (at least one), all free.
    pub fn new(count: u32) -> SlotTable {
        SlotTable {
            slots: vec![Slot::default(); count.max(1) as usize],
        }
    }

    /// The slot for `session`'s next request; `None` when every slot runs another
    /// session's request (the request then goes unpinned).
    pub fn pin(&mut self, session: &str, key: &CacheKey, uses: u64) -> Option<Pin> {
        let held = self
            .slots
            .iter()
            .position(|s| s.session.as_deref() == Some(session));
        let (index, warm) = match held {
            Some(i) => (i, true),
            None => {
                let free = self
                    .slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.busy == 0)
                    .min_by_key(|(_, s)| (s.session.is_some(), s.used))?;
                (free.0, false)
            }
        };
        let slot = &mut self.slots[index];
        slot.session = Some(session.to_owned());
        slot.busy += 1;
        slot.used = uses;
        Some(Pin {
            slot: index as u32,
            warm,
            session: session.to_owned(),
            key: key.clone(),
        })
    }

    /// A pinned request on `slot` ended.
    pub fn unpin(&mut self, slot: u32) {
        if let Some(s) = self.slots.get_mut(slot as usize) {
            s.busy = s.busy.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CacheKey {
        CacheKey {
            model_digest: String::new(),
            build_digest: String::new(),
            context_size: 0,
            args: vec![],
            serves: String::new(),
        }
    }

    #[test]
    fn a_session_keeps_its_slot_and_a_new_one_takes_the_least_recently_used_idle_one() {
        let k = key();
        let mut t = SlotTable::new(2);
        let a = t.pin("a", &k, 1).unwrap();
        assert!(!a.warm);
        t.unpin(a.slot);
        let b = t.pin("b", &k, 2).unwrap();
        assert_ne!(b.slot, a.slot, "a free slot before a held one");
        t.unpin(b.slot);
        let again = t.pin("a", &k, 3).unwrap();
        assert!(again.warm && again.slot == a.slot);
        t.unpin(again.slot);
        // c takes b's slot: a's was used more recently.
        let c = t.pin("c", &k, 4).unwrap();
        assert_eq!(c.slot, b.slot);
        assert!(!c.warm);
        // Every slot busy: nothing to pin.
        let a2 = t.pin("a", &k, 5).unwrap();
        assert!(t.pin("d", &k, 6).is_none());
        t.unpin(a2.slot);
        assert!(t.pin("d", &k, 7).is_some());
    }
}
