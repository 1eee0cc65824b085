//! A session's stream folded into what a step call needs: each step's state, the runs its
//! tool steps started, and the transcript.
//!
//! The fold is incremental: [`Index::apply`] takes the events after [`Index::version`], so a
//! session read once is kept current by reading only what was appended since.

use super::SessionError;
use crate::approvals::Ledger;
use crate::domain::DomainEvent;
use crate::events::RecordedEvent;
use crate::inference::{ContextEntry, ContextPack, SourceType, ToolCall};
use serde_json::{json, Value};
use std::collections::HashMap;

/// Where one step stands.
#[derive(Clone, Debug)]
pub(super) enum StepState {
    /// Claimed by `owner`, with no result yet.
    Claimed {
        digest: String,
        attempt: u32,
        owner: Value,
        invocation_id: Option<String>,
        call_id: Option<String>,
    },
    /// Its last try ended without a result: an inference (or a tool run that never started)
    /// is tried again; a tool run that started is closed from its outcome.
    Failed {
        digest: String,
        attempt: u32,
        invocation_id: Option<String>,
        call_id: Option<String>,
    },
    /// Its result: the `session.step_completed` payload.
    /// `position`: the record's, in the log (what a damaged record is named by).
    Done {
        digest: String,
        payload: Value,
        position: u64,
    },
}

impl StepState {
    pub(super) fn digest(&self) -> &str {
        match self {
            StepState::Claimed { digest, .. }
            | StepState::Failed { digest, .. }
            | StepState::Done { digest, .. } => digest,
        }
    }
}

/// What the log says of a run a tool step started.
#[derive(Clone, Debug, Default)]
pub(super) struct RunSeen {
    /// Its approval or start was recorded: it may have run.
    pub started: bool,
    /// Its outcome event.
    pub outcome: Option<DomainEvent>,
    /// A staged run's change set as recovery settled it after a crash (`promoted`, `kept`,
    /// `discarded`): where its working dirs are.
    pub recovered: Option<String>,
}

/// A session's stream, folded.
#[derive(Debug, Default)]
pub(super) struct Index {
    /// The last stream version applied (0: none).
    pub version: u64,
    pub steps: HashMap<String, StepState>,
    /// The runs of claimed tool steps, by invocation id.
    pub runs: HashMap<String, RunSeen>,
    /// The session's durable approval requests, by invocation id.
    pub approvals: Ledger,
    /// The context of the last inference step, as its request gave it: what the next
    /// request's delta is taken against.
    pub context: ContextPack,
    /// The last inference's answer, as a `model` entry.
    answer: Option<ContextEntry>,
    /// Tool entries since the last inference, in order; a retry under a new key with the same
    /// call id replaces its entry.
    tail: Vec<ContextEntry>,
    /// Steps recorded waiting, with the signal each waits for.
    pub waits: HashMap<String, String>,
    /// Signals sent, by name: the first's payload and position.
    pub signals: HashMap<String, (Value, u64)>,
}

impl Index {
    /// Folds one event of the stream in (events must come in version order).
    /// An event that cannot be read leaves the fold where it was, so every later call
    /// fails on it too (rather than skipping a step's record and running the step again).
    pub(super) fn apply(&mut self, e: &RecordedEvent) -> Result<(), SessionError> {
        self.fold(e)?;
        self.version = e.stream_version;
        Ok(())
    }

    fn fold(&mut self, e: &RecordedEvent) -> Result<(), SessionError> {
        let Some(event) = e.domain().map_err(SessionError::Events)? else {
            return Ok(());
        };
        if let Some(detail) = event.shape_problem() {
            return Err(SessionError::Corrupt {
                position: e.position,
                detail,
            });
        }
        match event {
            DomainEvent::SessionStepStarted {
                step,
                digest,
                attempt,
                owner,
                invocation_id,
                call_id,
                ..
            } => self.fold_step_started(step, digest, attempt, owner, invocation_id, call_id),
            DomainEvent::SessionStepFailed { step, attempt, .. } => {
                self.fold_step_failed(step, attempt);
            }
            DomainEvent::SessionStepCompleted {
                step,
                digest,
                answer,
                context,
                result,
                call_id,
                ..
            } => {
                let tool = result.as_ref().zip(call_id.as_ref());
                self.fold_step_completed(e, step, digest, answer.as_ref(), context.as_ref(), tool)?;
            }
            // A request, or a decision on one, waits for the step to be asked for again: the
            // run has not started.
            DomainEvent::ToolApprovalRequested { .. }
            | DomainEvent::ToolApprovalDecided {
                answers_request: true,
                ..
            } => self.approvals.apply(e, &event),
            DomainEvent::ToolApprovalDecided { invocation_id, .. }
            | DomainEvent::ToolExecutionStarted { invocation_id, .. } => {
                self.fold_run_started(&invocation_id);
            }
            DomainEvent::ToolExecutionCompleted {
                ref invocation_id, ..
            }
            | DomainEvent::ToolExecutionFailed {
                ref invocation_id, ..
            }
            | DomainEvent::ToolExecutionCancelled {
                ref invocation_id, ..
            }
            | DomainEvent::ToolExecutionInterrupted {
                ref invocation_id, ..
            }
            | DomainEvent::ToolExecutionRejected {
                ref invocation_id, ..
            } => self.fold_run_outcome(invocation_id, &event),
            DomainEvent::SessionWaiting { step, name, .. } => {
                self.waits.entry(step).or_insert(name);
            }
            // The first signal of a name is the one (a second is refused before it is
            // appended; one appended by an older correx changes nothing).
            DomainEvent::SessionSignaled { name, payload, .. } => {
                self.signals.entry(name).or_insert((payload, e.position));
            }
            // Where recovery left a staged run's working dirs.
            DomainEvent::WorkspaceSettled {
                ref invocation_id,
                ref state,
                ref by,
                ..
            } if by == "recovery" => {
                if let Some(r) = self.runs.get_mut(invocation_id) {
                    r.recovered = Some(state.clone());
                }
            }
            // Every other type is named, so a new one is a compile error here until it is
            // decided what it means for a session's steps and runs.
            DomainEvent::ModelLoaded { .. }
            | DomainEvent::ModelUnloaded { .. }
            | DomainEvent::ModelEndpointFailover { .. }
            | DomainEvent::ToolProgress { .. }
            | DomainEvent::ToolNetworkDenied { .. }
            | DomainEvent::WorkspaceSettled { .. }
            | DomainEvent::WorkspaceStaged { .. }
            | DomainEvent::InferenceCompleted { .. }
            | DomainEvent::EmbeddingCompleted { .. }
            | DomainEvent::ModelCacheRestored { .. }
            | DomainEvent::ModelCacheMissed { .. }
            | DomainEvent::ModelCacheSaved { .. }
            | DomainEvent::JobStarted { .. }
            | DomainEvent::JobExited { .. }
            | DomainEvent::McpServerStarted { .. }
            | DomainEvent::McpServerExited { .. }
            | DomainEvent::McpRequestRefused { .. }
            | DomainEvent::McpToolsPinned { .. }
            | DomainEvent::McpToolHeld { .. } => {}
        }
        Ok(())
    }

    /// A step claimed: its run (if it names one) is tracked from here.
    fn fold_step_started(
        &mut self,
        step: String,
        digest: String,
        attempt: u32,
        owner: Value,
        invocation_id: Option<String>,
        call_id: Option<String>,
    ) {
        if let Some(id) = &invocation_id {
            self.runs.entry(id.clone()).or_default();
        }
        self.steps.insert(
            step,
            StepState::Claimed {
                digest,
                attempt,
                owner,
                invocation_id,
                call_id,
            },
        );
    }

    /// A step's try `attempt` ended without a result.
    fn fold_step_failed(&mut self, step: String, attempt: u32) {
        // A failure names the try it ends; an older try's late word changes nothing.
        if let Some(StepState::Claimed {
            digest,
            attempt: a,
            invocation_id,
            call_id,
            ..
        }) = self.steps.get(&step)
        {
            if *a == attempt {
                let failed = StepState::Failed {
                    digest: digest.clone(),
                    attempt,
                    invocation_id: invocation_id.clone(),
                    call_id: call_id.clone(),
                };
                self.steps.insert(step, failed);
            }
        }
    }

    /// A step's result (`e`): an inference's answer and context, a tool step's result
    /// (with the call it answers) join the transcript. The first result of a step counts.
    fn fold_step_completed(
        &mut self,
        e: &RecordedEvent,
        step: String,
        digest: String,
        answer: Option<&Value>,
        context: Option<&Value>,
        tool: Option<(&Value, &String)>,
    ) -> Result<(), SessionError> {
        if matches!(self.steps.get(&step), Some(StepState::Done { .. })) {
            return Ok(());
        }
        let corrupt = |detail: String| SessionError::Corrupt {
            position: e.position,
            detail,
        };
        if let Some(answer) = answer {
            if let Some(context) = context {
                apply_context(&mut self.context, context).map_err(corrupt)?;
            }
            let tool_calls: Vec<ToolCall> =
                serde_json::from_value(answer["tool_calls"].clone()).unwrap_or_default();
            self.answer = Some(ContextEntry {
                source: SourceType::Model,
                content: answer["text"].as_str().unwrap_or_default().to_owned(),
                tool_calls,
                tool_call_id: None,
            });
            self.tail.clear();
        }
        if let Some((result, call)) = tool {
            let entry = ContextEntry {
                source: SourceType::Tool,
                content: tool_text(result),
                tool_calls: Vec::new(),
                tool_call_id: Some(call.clone()),
            };
            match self
                .tail
                .iter_mut()
                .find(|e| e.tool_call_id.as_ref() == Some(call))
            {
                Some(old) => *old = entry,
                None => self.tail.push(entry),
            }
        }
        let payload = e.payload.clone();
        self.steps.insert(
            step,
            StepState::Done {
                digest,
                payload,
                position: e.position,
            },
        );
        Ok(())
    }

    /// A tracked run's approval or start: it may have run.
    fn fold_run_started(&mut self, invocation_id: &str) {
        if let Some(r) = self.runs.get_mut(invocation_id) {
            r.started = true;
        }
    }

    /// A tracked run's outcome.
    fn fold_run_outcome(&mut self, invocation_id: &str, event: &DomainEvent) {
        if let Some(r) = self.runs.get_mut(invocation_id) {
            r.started = true;
            r.outcome = Some(event.clone());
        }
    }
}

/// A tool result's text in the transcript: the output of a success, the reason of a failure.
fn tool_text(result: &Value) -> String {
    let key = if result["status"] == "success" {
        "output"
    } else {
        "reason"
    };
    result[key].as_str().unwrap_or_default().to_owned()
}

impl Index {
    /// Whether `step` has its result.
    pub(super) fn recorded(&self, step: &str) -> bool {
        matches!(self.steps.get(step), Some(StepState::Done { .. }))
    }

    /// The conversation: the last inference's context, its answer, and the tool results
    /// since.
    pub(super) fn transcript(&self) -> ContextPack {
        let mut pack = self.context.clone();
        pack.entries.extend(self.answer.iter().cloned());
        pack.entries.extend(self.tail.iter().cloned());
        pack
    }
}

/// What `request` changes of `last` (the previous inference's context): the entries after
/// the prefix the two share (`keep` of them), and the system prompt and task when they
/// changed. A host that extends its conversation stores only its new entries, however it
/// words the earlier ones.
pub(super) fn context_delta(last: &ContextPack, request: &ContextPack) -> Value {
    let keep = last
        .entries
        .iter()
        .zip(&request.entries)
        .take_while(|(a, b)| a == b)
        .count();
    let mut delta = json!({"keep": keep, "entries": request.entries[keep..]});
    if request.system != last.system || request.task != last.task {
        delta["header"] = json!({"system": request.system, "task": request.task});
    }
    delta
}

fn apply_context(last: &mut ContextPack, delta: &Value) -> Result<(), String> {
    let entries: Vec<ContextEntry> = serde_json::from_value(delta["entries"].clone())
        .map_err(|e| format!("a step's context entries: {e}"))?;
    let keep = delta["keep"]
        .as_u64()
        .and_then(|k| usize::try_from(k).ok())
        .filter(|&k| k <= last.entries.len())
        .ok_or_else(|| {
            format!(
                "a step's context keeps {} entries of {}",
                delta["keep"],
                last.entries.len()
            )
        })?;
    if let Some(header) = delta.get("header") {
        let text = |k: &str| header[k].as_str().map(str::to_owned);
        last.system = text("system");
        last.task = text("task");
    }
    last.entries.truncate(keep);
    last.entries.extend(entries);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(entries: &[&str]) -> ContextPack {
        ContextPack {
            system: Some("sys".into()),
            task: Some("task".into()),
            entries: entries
                .iter()
                .map(|t| ContextEntry::new(SourceType::User, *t))
                .collect(),
        }
    }

    #[test]
    fn a_request_stores_only_what_it_changed_of_the_last_one() {
        let mut last = pack(&["a"]);
        let d = context_delta(&last, &pack(&["a", "b", "c"]));
        assert_eq!((d["keep"].as_u64(), d.get("header")), (Some(1), None));
        assert_eq!(d["entries"].as_array().map(Vec::len), Some(2));
        apply_context(&mut last, &d).unwrap();
        assert_eq!(last, pack(&["a", "b", "c"]));

        // An edited entry keeps the prefix before it; another system prompt is stored.
        let d = context_delta(&last, &pack(&["a", "x", "c", "d"]));
        assert_eq!(d["keep"], 1);
        apply_context(&mut last, &d).unwrap();
        assert_eq!(last, pack(&["a", "x", "c", "d"]));
        let mut other = pack(&["a"]);
        other.system = None;
        let d = context_delta(&last, &other);
        assert!(d.get("header").is_some());
        apply_context(&mut last, &d).unwrap();
        assert_eq!(last, other);

        // A delta that keeps more than there is names the problem.
        let bad = json!({"keep": 9, "entries": []});
        assert!(apply_context(&mut last, &bad)
            .unwrap_err()
            .contains("keeps 9"));
    }
}
