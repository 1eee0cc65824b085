//! Tool-list pinning: each server's tool definitions are pinned in the log (the
//! [`PINS_STREAM`] stream) the first time they are listed, by the digest of each definition;
//! a later listing whose definition of a tool differs (a "rug pull": a description or schema
//! changed under an approved server) is held: its calls are refused, or asked of a person,
//! until it is pinned again (an approval of such a call, or the host). A tool first listed
//! later is pinned as first seen.

use super::config::McpToolChange;
use crate::domain::DomainEvent;
use crate::events::{EventStore, ExpectedVersion};
use parking_lot::Mutex;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// The stream tool pins and held tools go to.
pub const PINS_STREAM: &str = "mcp-pins";

/// A held tool's definition larger than this is not copied into its `mcp.tool_held` event.
const MAX_RECORDED_DEFINITION: usize = 64 << 10;

/// Events read from the log at a time.
const PAGE: usize = 1000;

/// The digest a pin holds of one tool's definition as listed (its `_meta`, which is not
/// shown to a model, left out): `sha256:<hex>` of its JSON with keys sorted.
pub(crate) fn digest(definition: &Value) -> String {
    let mut shown = definition.clone();
    if let Some(o) = shown.as_object_mut() {
        o.remove("_meta");
    }
    // serde_json's maps keep their keys sorted: one definition, one text.
    let text = shown.to_string();
    format!(
        "sha256:{}",
        crate::text::hex(&Sha256::digest(text.as_bytes()))
    )
}

/// A tool whose listed definition is not the one pinned.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Held {
    /// The digest pinned for it; none for a tool added after the pin.
    pub pinned: Option<String>,
    /// The digest of the definition listed now.
    pub listed: String,
    /// What its calls get.
    pub action: McpToolChange,
}

impl Held {
    /// Why a call of `tool` is held, for the caller and the approver.
    pub fn reason(&self, tool: &str) -> String {
        let what = match &self.pinned {
            Some(p) => format!(
                "its definition changed since it was pinned ({p}, now {})",
                self.listed
            ),
            None => format!(
                "it was added after the server's tools were pinned (its definition is {})",
                self.listed
            ),
        };
        match self.action {
            McpToolChange::Refuse => format!(
                "{tool} is held: {what}; it is not used until it is pinned again \
                 (`correx mcp pin DB SERVER`, or McpHub::pin_tools)"
            ),
            McpToolChange::Ask => format!("{tool}: {what}; a person must approve the call"),
        }
    }
}

#[derive(Default)]
struct Folded {
    /// The next stream version to read.
    next: u64,
    /// Per server, each tool's pinned digest.
    pins: HashMap<String, BTreeMap<String, String>>,
    /// Held listings recorded already (server, tool, digest), so each is recorded once.
    recorded: HashSet<(String, String, String)>,
}

/// The pins of every server of one log; read from the log when first needed, and again
/// whenever a held tool is looked at (another process may have pinned it).
pub(crate) struct Pins {
    events: Arc<dyn EventStore>,
    folded: Mutex<Folded>,
}

impl Pins {
    pub fn new(events: Arc<dyn EventStore>) -> Pins {
        Pins {
            events,
            folded: Mutex::new(Folded::default()),
        }
    }

    /// Reads what the log added since the last read.
    fn refresh(&self, f: &mut Folded) -> Result<(), String> {
        loop {
            let from = f.next.max(1);
            let page = self
                .events
                .read_stream_verified(PINS_STREAM, from, PAGE)
                .map_err(|e| format!("its tool pins cannot be read from the log: {e}"))?;
            let Some(last) = page.last().map(|e| e.stream_version) else {
                return Ok(());
            };
            for e in &page {
                let read = e
                    .domain()
                    .map_err(|e| format!("its tool pins cannot be read from the log: {e}"))?;
                match read {
                    Some(DomainEvent::McpToolsPinned { server, tools, .. }) => {
                        f.pins.entry(server).or_default().extend(tools);
                    }
                    Some(DomainEvent::McpToolHeld {
                        server,
                        tool,
                        listed,
                        ..
                    }) => {
                        f.recorded.insert((server, tool, listed));
                    }
                    _ => {}
                }
            }
            f.next = last + 1;
            if page.len() < PAGE {
                return Ok(());
            }
        }
    }

    fn append(&self, e: &DomainEvent) -> Result<(), String> {
        self.events
            .append(PINS_STREAM, ExpectedVersion::Any, &[e.to_new_event()])
            .map(drop)
            .map_err(|err| format!("recording {}: {err}", e.type_id()))
    }

    /// Checks `server`'s listing (each tool's name and definition as listed): its first
    /// listing ever is pinned (`first_use`); afterwards each tool whose digest is not the one
    /// pinned is held (recorded once per definition). The held tools, by name.
    ///
    /// # Errors
    /// The log could not be read or written: the listing cannot be checked.
    pub fn review(
        &self,
        server: &str,
        listed: &[(String, Value)],
        action: McpToolChange,
    ) -> Result<HashMap<String, Held>, String> {
        let mut f = self.folded.lock();
        self.refresh(&mut f)?;
        let digests: BTreeMap<String, String> = listed
            .iter()
            .map(|(name, def)| (name.clone(), digest(def)))
            .collect();
        let Some(pinned) = f.pins.get(server) else {
            let e = DomainEvent::McpToolsPinned {
                server: server.to_owned(),
                tools: digests.clone(),
                by: "first_use".into(),
                invocation_id: None,
            };
            self.append(&e)?;
            f.pins.insert(server.to_owned(), digests);
            return Ok(HashMap::new());
        };
        // A tool never listed before is pinned as first seen (a server lists some tools only
        // to a client declaring a capability); one whose definition changed is held.
        let new: BTreeMap<String, String> = digests
            .iter()
            .filter(|(name, _)| !pinned.contains_key(*name))
            .map(|(n, d)| (n.clone(), d.clone()))
            .collect();
        let mut held = HashMap::new();
        for (name, _) in listed {
            let listed = &digests[name];
            let Some(was) = pinned.get(name) else {
                continue;
            };
            if was == listed {
                continue;
            }
            let was = Some(was);
            let h = Held {
                pinned: was.cloned(),
                listed: listed.clone(),
                action,
            };
            held.insert(name.clone(), h);
        }
        if !new.is_empty() {
            self.append(&DomainEvent::McpToolsPinned {
                server: server.to_owned(),
                tools: new.clone(),
                by: "first_use".into(),
                invocation_id: None,
            })?;
            f.pins.entry(server.to_owned()).or_default().extend(new);
        }
        for (name, h) in &held {
            let key = (server.to_owned(), name.clone(), h.listed.clone());
            if f.recorded.contains(&key) {
                continue;
            }
            let def = listed.iter().find(|(n, _)| n == name).map(|(_, d)| d);
            let definition = def
                .filter(|d| d.to_string().len() <= MAX_RECORDED_DEFINITION)
                .cloned();
            log::warn!("mcp server {server}: {}", h.reason(name));
            self.append(&DomainEvent::McpToolHeld {
                server: server.to_owned(),
                tool: name.clone(),
                pinned: h.pinned.clone(),
                listed: h.listed.clone(),
                action: match action {
                    McpToolChange::Refuse => "refused",
                    McpToolChange::Ask => "asked",
                }
                .into(),
                definition,
            })?;
            f.recorded.insert(key);
        }
        Ok(held)
    }

    /// Whether `tool` of `server`, listed with `digest`, is pinned now (the log read again:
    /// it may have been pinned by another process since it was held).
    ///
    /// # Errors
    /// The log could not be read.
    pub fn pinned(&self, server: &str, tool: &str, digest: &str) -> Result<bool, String> {
        let mut f = self.folded.lock();
        self.refresh(&mut f)?;
        Ok(f.pins
            .get(server)
            .and_then(|p| p.get(tool))
            .is_some_and(|d| d == digest))
    }

    /// Pins `tools` (name and digest) of `server`, recorded as pinned `by`.
    ///
    /// # Errors
    /// The pin could not be recorded (nothing is pinned then).
    pub fn pin(
        &self,
        server: &str,
        tools: BTreeMap<String, String>,
        by: &str,
        invocation_id: Option<String>,
    ) -> Result<(), String> {
        if tools.is_empty() {
            return Ok(());
        }
        let mut f = self.folded.lock();
        self.append(&DomainEvent::McpToolsPinned {
            server: server.to_owned(),
            tools: tools.clone(),
            by: by.to_owned(),
            invocation_id,
        })?;
        f.pins.entry(server.to_owned()).or_default().extend(tools);
        Ok(())
    }
}

/// Pins what is held of `server` in `events`: each tool's latest held definition that no
/// later pin covers (only those of `tools`, when it names any), recorded as pinned by the
/// `host`. A runtime holding them sees the pin at the tool's next use. What was pinned (tool
/// and digest); empty when nothing was held.
///
/// # Errors
/// The log could not be read or written.
pub fn pin_held_tools(
    events: &dyn EventStore,
    server: &str,
    tools: &[&str],
) -> crate::events::Result<BTreeMap<String, String>> {
    let mut held = held_in_log(events, server)?;
    if !tools.is_empty() {
        held.retain(|t, _| tools.contains(&t.as_str()));
    }
    if !held.is_empty() {
        let e = DomainEvent::McpToolsPinned {
            server: server.to_owned(),
            tools: held.clone(),
            by: "host".into(),
            invocation_id: None,
        };
        events.append(PINS_STREAM, ExpectedVersion::Any, &[e.to_new_event()])?;
    }
    Ok(held)
}

/// The definitions held for `server` in `events` that no later pin covers: each tool's
/// latest held digest.
fn held_in_log(
    events: &dyn EventStore,
    server: &str,
) -> crate::events::Result<BTreeMap<String, String>> {
    let mut held = BTreeMap::new();
    let mut pinned: BTreeMap<String, String> = BTreeMap::new();
    let mut from = 1;
    loop {
        let page = events.read_stream_verified(PINS_STREAM, from, PAGE)?;
        let Some(last) = page.last().map(|e| e.stream_version) else {
            break;
        };
        for e in &page {
            match e.domain()? {
                Some(DomainEvent::McpToolsPinned {
                    server: s, tools, ..
                }) if s == server => {
                    pinned.extend(tools);
                }
                Some(DomainEvent::McpToolHeld {
                    server: s,
                    tool,
                    listed,
                    ..
                }) if s == server => {
                    held.insert(tool, listed);
                }
                _ => {}
            }
        }
        from = last + 1;
        if page.len() < PAGE {
            break;
        }
    }
    held.retain(|tool, digest| pinned.get(tool) != Some(digest));
    Ok(held)
}
