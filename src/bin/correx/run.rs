//! `correx run diff DB INVOCATION`: what a staged run changed, as its log records it — one
//! line per changed path, then the unified diff of its text files.

use crate::args::Args;
use crate::log::{for_each_event, open};
use crate::style::line;
use crate::Failure;
use serde_json::Value;

pub fn diff(args: Args) -> Result<(), Failure> {
    let [db, invocation] = args.positionals(&["DB", "INVOCATION"])?[..] else {
        unreachable!("positionals returns exactly two")
    };
    let store = open(db)?;
    let mut found: Option<Value> = None;
    let mut settled: Option<String> = None;
    for_each_event(&store, 0, |e| {
        if e.payload["invocation_id"].as_str() == Some(invocation) {
            match e.type_id.as_str() {
                "workspace.staged" => found = Some(e.payload),
                "workspace.settled" => {
                    let s = |k: &str| e.payload[k].as_str().unwrap_or("?").to_owned();
                    settled = Some(format!("{} by the {}", s("state"), s("by")));
                }
                _ => {}
            }
        }
        true
    })?;
    let Some(p) = found else {
        return Err(Failure::Run(format!(
            "no staged change set of invocation {invocation:?} in {db} (was it a staged run?)"
        )));
    };
    if args.switch(&["--json"]) {
        let text = serde_json::to_string_pretty(&p).map_err(|e| Failure::Run(e.to_string()))?;
        line(&text);
        return Ok(());
    }
    let state = p["state"].as_str().unwrap_or("?");
    line(&format!(
        "# {} paths changed, {} bytes; {state}{}",
        p["summary"]["paths"].as_u64().unwrap_or(0),
        p["summary"]["bytes"].as_u64().unwrap_or(0),
        settled.map(|s| format!(", then {s}")).unwrap_or_default()
    ));
    if let Some(r) = p["reason"].as_str() {
        line(&format!("# {r}"));
    }
    for c in p["changes"].as_array().into_iter().flatten() {
        let mark = match c["kind"].as_str().unwrap_or("") {
            "added" => "A",
            "modified" => "M",
            "deleted" => "D",
            "mode_changed" => "m",
            "touched" => "T",
            "special" => "S",
            _ => "?",
        };
        let extra = match (c["type"].as_str(), c["target"].as_str()) {
            (Some("symlink"), Some(t)) => format!(" -> {t}"),
            (Some("dir"), _) => "/".to_owned(),
            _ => String::new(),
        };
        line(&format!(
            "{mark} {}{extra}",
            c["path"].as_str().unwrap_or("?")
        ));
    }
    let diff = p["diff"].as_str().unwrap_or("");
    if !diff.is_empty() {
        print!("{diff}");
    }
    if p["diff_truncated"].as_bool() == Some(true) {
        line("# the diff was cut short (256 KiB at most are recorded); files past it are listed above");
    }
    Ok(())
}
