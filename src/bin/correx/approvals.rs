//! `correx approvals list DB` and `correx approvals decide DB SESSION ID approve|deny`: the
//! durable approval requests of a log, decided from any terminal (the first decision wins).

use crate::args::Args;
use crate::log::open;
use crate::style::line;
use crate::Failure;
use correx::{ApprovalDecision, ApprovalError, ApprovalRecord, Approvals, EventStore};
use std::sync::Arc;

fn approvals(db: &str) -> Result<Approvals, Failure> {
    let store: Arc<dyn EventStore> = open(db)?;
    Ok(Approvals::new(store))
}

fn failure(e: ApprovalError) -> Failure {
    match e {
        ApprovalError::InvalidRequest(m) => Failure::Usage(m),
        other => Failure::Run(other.to_string()),
    }
}

/// One line per request: session, id, tool, what it asks, and its state.
fn describe(r: &ApprovalRecord) -> String {
    let what = match &r.argv {
        Some(argv) => serde_json::to_string(argv).unwrap_or_default(),
        None => serde_json::to_string(&r.parameters).unwrap_or_default(),
    };
    let what: String = what.chars().take(160).collect();
    let state = match &r.decision {
        None => match r.deadline_ms {
            Some(d) => format!("pending (expires at {d} ms)"),
            None => "pending".into(),
        },
        Some(d) => {
            let who = d.identity.as_deref().unwrap_or(&d.decided_by);
            format!("{} by {who}", d.decision)
        }
    };
    format!(
        "{}\t{}\t{} (T{})\t{what}\t{state}",
        r.session_id, r.request_id, r.tool_name, r.tier
    )
}

pub fn list(args: Args) -> Result<(), Failure> {
    let [db] = args.positionals(&["DB"])?[..] else {
        unreachable!("positionals returns exactly one")
    };
    let records = approvals(db)?
        .list(args.switch(&["--all"]))
        .map_err(failure)?;
    if args.switch(&["--json"]) {
        for r in &records {
            line(&serde_json::to_string(r).map_err(|e| Failure::Run(e.to_string()))?);
        }
        return Ok(());
    }
    for r in &records {
        line(&describe(r));
    }
    Ok(())
}

pub fn decide(args: Args) -> Result<(), Failure> {
    let [db, session, id, answer] = args.positionals(&["DB", "SESSION", "ID", "approve|deny"])?[..]
    else {
        unreachable!("positionals returns exactly four")
    };
    let remember = args.switch(&["--remember"]);
    let decision = match (answer, remember) {
        ("approve", false) => ApprovalDecision::Approved,
        ("approve", true) => ApprovalDecision::ApprovedForSession,
        ("deny", false) => ApprovalDecision::denied(
            args.value("--reason")
                .map_or_else(|| "denied from the command line".to_owned(), str::to_owned),
        ),
        ("deny", true) => {
            return Err(Failure::Usage(
                "--remember goes with approve (a denial is for this request only)".into(),
            ))
        }
        (other, _) => {
            return Err(Failure::Usage(format!(
                "the decision is approve or deny, not {other:?}"
            )))
        }
    };
    let identity = match args.value("--by") {
        Some(by) => by.to_owned(),
        None => format!(
            "{}@cli",
            std::env::var("USER").unwrap_or_else(|_| "someone".into())
        ),
    };
    let decided = approvals(db)?
        .decide(session, id, &decision, &identity)
        .map_err(failure)?;
    line(&format!(
        "{id}: {} by {identity} (log position {})",
        decided.decision, decided.position
    ));
    Ok(())
}
