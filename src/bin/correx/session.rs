//! `correx session show DB S`: a durable session's conversation, rebuilt from the log;
//! `correx session signal DB S NAME [PAYLOAD]`: a signal to its waits.

use crate::args::Args;
use crate::log::open;
use crate::style::line;
use crate::Failure;
use correx::{EventStore, Session, SourceType};
use std::sync::Arc;

pub fn show(args: Args) -> Result<(), Failure> {
    let [db, id] = args.positionals(&["DB", "SESSION"])?[..] else {
        unreachable!("positionals returns exactly two")
    };
    let store: Arc<dyn EventStore> = open(db)?;
    let session = Session::open(store, id).map_err(|e| Failure::Run(e.to_string()))?;
    let pack = session
        .transcript()
        .map_err(|e| Failure::Run(e.to_string()))?;
    if args.switch(&["--json"]) {
        let text = serde_json::to_string_pretty(&pack).map_err(|e| Failure::Run(e.to_string()))?;
        line(&text);
        return Ok(());
    }
    if pack.is_empty() {
        line(&format!("session {id}: no steps recorded"));
        return Ok(());
    }
    if let Some(s) = &pack.system {
        line(&format!("system: {s}"));
    }
    if let Some(t) = &pack.task {
        line(&format!("task: {t}"));
    }
    for e in &pack.entries {
        let who = match (e.source, &e.tool_call_id) {
            (SourceType::User, _) => "user".to_owned(),
            (SourceType::Model, _) => "model".to_owned(),
            (SourceType::Tool, Some(call)) => format!("tool ({call})"),
            (SourceType::Tool, None) => "tool".to_owned(),
        };
        line(&format!("{who}: {}", e.content));
        for call in &e.tool_calls {
            line(&format!(
                "  calls {} ({}): {}",
                call.name, call.id, call.arguments
            ));
        }
    }
    Ok(())
}

/// `correx session signal DB S NAME [PAYLOAD] [--by NAME]`: answers the session's waits for
/// NAME with PAYLOAD (JSON; default `null`).
pub fn signal(args: Args) -> Result<(), Failure> {
    let positional = args.positionals_between(&["DB", "SESSION", "NAME"], &["PAYLOAD"])?;
    let (db, id, name) = (positional[0], positional[1], positional[2]);
    let payload = match positional.get(3) {
        Some(text) => serde_json::from_str(text)
            .map_err(|e| Failure::Usage(format!("PAYLOAD is not JSON: {e}")))?,
        None => serde_json::Value::Null,
    };
    let by = match args.value("--by") {
        Some(by) => by.to_owned(),
        None => format!(
            "{}@cli",
            std::env::var("USER").unwrap_or_else(|_| "someone".into())
        ),
    };
    let store: Arc<dyn EventStore> = open(db)?;
    let session = Session::open(store, id).map_err(|e| Failure::Run(e.to_string()))?;
    let position = session
        .signal(name, payload, Some(&by))
        .map_err(|e| Failure::Run(e.to_string()))?;
    line(&format!(
        "signal {name:?} sent to session {id} by {by} (log position {position})"
    ));
    Ok(())
}
