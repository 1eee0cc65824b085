//! `correx tool run`: one tool through the sandbox, approved on the terminal, recorded in the
//! config's event log.

use crate::args::Args;
use crate::style::line;
use crate::Failure;
use correx::{
    ApprovalContext, ApprovalDecision, CallbackApprover, Runtime, RuntimeConfig, SessionId,
    ToolRequest, ToolResult,
};
use std::io::{BufRead, Write};
use std::sync::Arc;

/// Asks on stderr and reads the answer from stdin: y approves, a approves (and says the
/// session answer is not kept past this one run), anything else denies.
fn ask(tool: &str, tier: i32, request: &str) -> Result<ApprovalDecision, String> {
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "correx: run {tool} (T{tier}) with {request}? [y]es / [n]o / [a]lways for this session: "
    );
    let _ = err.flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| format!("no answer: {e}"))?;
    match answer.trim() {
        "y" | "Y" | "yes" => Ok(ApprovalDecision::Approved),
        "a" | "A" | "always" => {
            eprintln!(
                "correx: approved for the session; this command runs one tool, so the answer ends with it"
            );
            Ok(ApprovalDecision::ApprovedForSession)
        }
        "" => Err("no answer (end of input); denied".into()),
        other => Ok(ApprovalDecision::denied(format!(
            "denied on the terminal (answer {other:?})"
        ))),
    }
}

pub fn run(args: Args) -> Result<(), Failure> {
    let [tool, params] = args.positionals(&["TOOL", "JSON"])?[..] else {
        unreachable!("positionals returns exactly two")
    };
    let config_path = args
        .value("--config")
        .ok_or_else(|| Failure::Usage("tool run needs --config FILE".into()))?;
    let text = std::fs::read_to_string(config_path)
        .map_err(|e| Failure::Run(format!("cannot read the config {config_path}: {e}")))?;
    let config = RuntimeConfig::from_json(&text)
        .map_err(|e| Failure::Run(format!("config {config_path}: {e}")))?;
    let parameters = match serde_json::from_str::<serde_json::Value>(params) {
        Ok(serde_json::Value::Object(m)) => m,
        Ok(other) => {
            return Err(Failure::Usage(format!(
                "the tool's JSON must be an object, not {other}"
            )))
        }
        Err(e) => {
            return Err(Failure::Usage(format!(
                "the tool's JSON does not parse: {e}"
            )))
        }
    };
    let approver = CallbackApprover::with_answer(|req, _ctx| {
        let shown = serde_json::Value::Object(req.request.parameters.clone()).to_string();
        ask(&req.tool_name, req.tier.as_i32(), &shown)
    });
    let runtime = Runtime::new(&config, Arc::new(approver))
        .map_err(|e| Failure::Run(format!("cannot open the runtime: {e}")))?;
    let session = args
        .value("--session")
        .map(str::to_owned)
        .unwrap_or_else(|| format!("cli-{}", std::process::id()));
    let request = ToolRequest::new(SessionId::from_string(session.clone()), tool, parameters);
    let result = runtime.executor().execute_in(
        &request,
        &ApprovalContext::new(SessionId::from_string(session)),
    );
    match result {
        ToolResult::Success {
            output, metadata, ..
        } => {
            line(&output);
            for (k, v) in metadata {
                eprintln!("correx: {k}: {v}");
            }
            Ok(())
        }
        ToolResult::Failure {
            reason,
            recoverable,
            ..
        } => Err(Failure::Run(format!(
            "{tool} failed{}: {reason}",
            if recoverable {
                " (a changed request may succeed)"
            } else {
                ""
            }
        ))),
    }
}
