//! Who performs a claimed step, and whether that performer still lives.
//!
//! A claim names its process (pid and start time, so a reused pid is not mistaken for it),
//! the boot, the pid namespace and a claim id. Inside this process a claim lives while its
//! [`Claim`] does (a panic or an early return drops it); another process's claim lives while
//! that process does. No lock is held while the step runs.

use crate::ids::EventId;
use crate::sys;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// The claims this process holds now.
static LIVE: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

#[derive(Clone)]
struct Me {
    pid: u32,
    start: Option<u64>,
    boot: Option<String>,
    machine: Option<String>,
    ns: Option<String>,
}

/// This process, read once (and again in a child forked since: its pid differs).
fn me() -> Me {
    static ME: Mutex<Option<Me>> = Mutex::new(None);
    let pid = std::process::id();
    let mut cached = ME.lock();
    match &*cached {
        Some(me) if me.pid == pid => me.clone(),
        _ => {
            let me = Me {
                pid,
                start: sys::process_start(pid).ok().map(|(start, _)| start),
                boot: sys::boot_id(),
                machine: sys::machine_id(),
                ns: sys::pid_namespace(pid),
            };
            *cached = Some(me.clone());
            me
        }
    }
}

/// One claim of this process; it ends when dropped.
pub(super) struct Claim {
    id: String,
}

impl Claim {
    /// A new live claim.
    pub(super) fn new() -> Claim {
        let id = EventId::random().as_str().to_owned();
        LIVE.lock().insert(id.clone());
        Claim { id }
    }

    /// The owner recorded in `session.step_started`.
    pub(super) fn owner(&self) -> Value {
        let me = me();
        json!({"pid": me.pid, "start": me.start, "boot": me.boot, "machine": me.machine,
               "ns": me.ns, "claim": self.id})
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        LIVE.lock().remove(&self.id);
    }
}

/// What can be said of a recorded owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Liveness {
    /// It is still performing the step.
    Alive,
    /// It is gone: the step will not get a result from it.
    Dead,
    /// Another pid namespace, another machine sharing the log, or a machine without `/proc`:
    /// nothing can be told.
    Unknown,
}

/// Whether the owner of a claim still lives.
pub(super) fn judge(owner: &Value) -> Liveness {
    let me = me();
    let (Some(pid), Some(boot)) = (owner["pid"].as_u64(), owner["boot"].as_str()) else {
        return Liveness::Unknown;
    };
    // A claim of another machine (a log shared through PostgreSQL) cannot be judged from here;
    // one of this machine before its last boot is dead.
    if let (Some(theirs), Some(mine)) = (owner["machine"].as_str(), &me.machine) {
        if theirs != mine {
            return Liveness::Unknown;
        }
    }
    match &me.boot {
        Some(mine) if mine != boot => return Liveness::Dead,
        Some(_) => {}
        None => return Liveness::Unknown,
    }
    let start = owner["start"].as_u64();
    if u64::from(me.pid) == pid && me.start == start {
        let claim = owner["claim"].as_str().unwrap_or_default();
        return if LIVE.lock().contains(claim) {
            Liveness::Alive
        } else {
            Liveness::Dead
        };
    }
    if owner["ns"].as_str() != me.ns.as_deref() {
        return Liveness::Unknown;
    }
    let Ok(pid) = u32::try_from(pid) else {
        return Liveness::Dead;
    };
    match (sys::process_start(pid), start) {
        (Ok((now, zombie)), Some(then)) if now == then && !zombie => Liveness::Alive,
        (Ok(_), _) => Liveness::Dead,
        (Err(e), _) if e.kind() == std::io::ErrorKind::NotFound => Liveness::Dead,
        // `/proc` hides it (hidepid) or is not there: nothing can be told.
        (Err(_), _) => Liveness::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_lives_while_held_and_a_reused_pid_is_not_its_owner() {
        let claim = Claim::new();
        let owner = claim.owner();
        assert_eq!(judge(&owner), Liveness::Alive);
        drop(claim);
        assert_eq!(judge(&owner), Liveness::Dead, "a dropped claim is over");

        // This machine's pid 1 lives, but started at another time than recorded.
        let mut other = owner.clone();
        other["pid"] = json!(1);
        other["start"] = json!(u64::MAX);
        assert_eq!(judge(&other), Liveness::Dead);
        other["start"] = json!(sys::process_start(1).ok().map(|(start, _)| start));
        other["ns"] = json!(sys::pid_namespace(1));
        if other["ns"] == owner["ns"] {
            assert_eq!(judge(&other), Liveness::Alive);
        }
        other["boot"] = json!("another-boot");
        assert_eq!(
            judge(&other),
            Liveness::Dead,
            "a claim from an earlier boot"
        );
        other["boot"] = owner["boot"].clone();
        other["ns"] = json!("pid:[1]");
        assert_eq!(judge(&other), Liveness::Unknown);

        // Another host sharing the log: its boot differs from ours, yet it may live.
        let mut remote = owner.clone();
        remote["boot"] = json!("another-boot");
        remote["machine"] = json!("another-machine");
        if owner["machine"].is_string() {
            assert_eq!(
                judge(&remote),
                Liveness::Unknown,
                "a claim of another machine"
            );
        }
    }
}
