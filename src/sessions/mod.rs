//! Durable sessions: each step of an agent turn (an inference or a tool run, under a key the
//! host chooses) performed once and recorded in the session's stream, so a host that crashed
//! mid-turn resumes without repeating a model call or a side effect.
//!
//! A step call reads the stream (incrementally), and then:
//! - the key has a result: it is returned (`replayed`), unless the request's digest differs
//!   ([`SessionError::Conflict`]);
//! - the key is unclaimed, or its last try failed, or its owner died before a side effect
//!   could have happened (an inference; a tool run whose approval or start was never
//!   recorded): it appends `session.step_started` at the version it read (optimistic
//!   concurrency: of two claimers one wins, the other reads again), performs the step with no
//!   lock held, and appends `session.step_completed`;
//! - another live caller holds the claim: it waits for that result;
//! - the owner died after its tool run started: the step is closed with the run's recorded
//!   outcome (recovery records one when a runtime opens), returned as the step's result
//!   (`interrupted`, with the files as recovery left them). The host decides whether to try
//!   again under a new key; correx never runs a side effect twice on its own.
//!
//! Everything a step records is one event (one row): an inference's whole answer, a tool's
//! whole result. Both are bounded upstream (`max_tokens`; the tools' output caps), so no side
//! table is needed, and `correx log verify` checks step events as it checks every other.

mod digest;
mod fold;
mod owner;

use crate::cancel::CancelToken;
use crate::domain::{session_stream, DomainEvent};
use crate::events::{EventStore, EventStoreError, ExpectedVersion};
use crate::inference::{
    ContextPack, InferenceError, InferenceProvider, InferenceRequest, InferenceResponse,
    StreamChunk, StreamControl,
};
use crate::tools::Recoverable;
use crate::tools::{ToolErrorKind, ToolExecutor, ToolRequest, ToolResult};
use fold::{Index, StepState};
use owner::{Claim, Liveness};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest step key, in bytes.
pub const MAX_STEP_KEY: usize = 256;

/// Why a step call did not answer.
#[derive(Debug)]
#[non_exhaustive]
pub enum SessionError {
    /// The session id or the step key is malformed, or a tool request names another session.
    InvalidRequest(String),
    /// The key already belongs to another request (its digest differs): a step is never
    /// answered with another request's result. Use a new key for a new request.
    Conflict {
        /// The key.
        step: String,
        /// The digest recorded for it.
        recorded: String,
        /// The digest of this call's request.
        requested: String,
    },
    /// Another process holds the step and whether it still lives cannot be told (it runs in
    /// another pid namespace): try again later.
    InProgress {
        /// The key.
        step: String,
    },
    /// The step's owner died while its tool ran, and the run has no outcome yet: open a
    /// runtime on the sandbox root again (recovery closes the run), then call again.
    InDoubt {
        /// The key.
        step: String,
        /// The run.
        invocation_id: String,
    },
    /// The step's tool run waits for a durable approval decision (request `request_id`, a
    /// `tool.approval_requested` in the session's stream): nothing ran. Decide it from any
    /// process ([`crate::Approvals::decide`], `correx approvals decide`), then call the step
    /// again (same key, any process); the run happens once, after the decision.
    Pending {
        /// The key.
        step: String,
        /// The request that waits.
        request_id: String,
        /// When it expires (milliseconds since the Unix epoch); none: never.
        deadline_ms: Option<i64>,
    },
    /// The wait step waits for signal `name` ([`Session::wait`]), recorded as
    /// `session.waiting`: send it from any process ([`Session::signal`]), then call the step
    /// again (same key, any process).
    Waiting {
        /// The key.
        step: String,
        /// The signal it waits for.
        name: String,
    },
    /// A signal of this name was already sent to the session: the first is the one every wait
    /// for it gets.
    AlreadySignaled {
        /// The signal's name.
        name: String,
        /// Where the first is in the log.
        position: u64,
    },
    /// The inference failed; nothing was recorded as the step's result, and the next call
    /// with the key tries again.
    Inference(InferenceError),
    /// The cancel token was triggered while waiting for another caller's result.
    Cancelled,
    /// The event log failed.
    Events(EventStoreError),
    /// A step event in the log cannot be read.
    Corrupt {
        /// Its position in the log.
        position: u64,
        /// What is wrong.
        detail: String,
    },
}

impl fmt::Display for SessionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionError::InvalidRequest(m) => f.write_str(m),
            SessionError::Conflict {
                step,
                recorded,
                requested,
            } => write!(
                f,
                "step {step:?} was recorded for another request (digest {recorded}, this one \
                 {requested}); a new request needs a new step key"
            ),
            SessionError::InProgress { step } => write!(
                f,
                "step {step:?} is being performed by a process this one cannot see (another pid \
                 namespace); try again later"
            ),
            SessionError::InDoubt {
                step,
                invocation_id,
            } => write!(
                f,
                "step {step:?}: its owner died while tool run {invocation_id} ran, and the run \
                 has no outcome yet; open a runtime on the sandbox root again to recover it"
            ),
            SessionError::Pending {
                step, request_id, ..
            } => write!(
                f,
                "step {step:?} waits for approval request {request_id:?} (`correx approvals \
                 list` shows it); call the step again after a decision"
            ),
            SessionError::Waiting { step, name } => write!(
                f,
                "step {step:?} waits for signal {name:?}; send it (Session::signal, \
                 correx_session_signal) from any process, then call the step again"
            ),
            SessionError::AlreadySignaled { name, position } => write!(
                f,
                "signal {name:?} was already sent to this session (position {position}); the \
                 first one answers its waits"
            ),
            SessionError::Inference(e) => write!(f, "inference failed: {e}"),
            SessionError::Cancelled => f.write_str("cancelled while waiting for the step"),
            SessionError::Events(e) => e.fmt(f),
            SessionError::Corrupt { position, detail } => {
                write!(f, "the session's event at position {position}: {detail}")
            }
        }
    }
}

impl std::error::Error for SessionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SessionError::Inference(e) => Some(e),
            SessionError::Events(e) => Some(e),
            _ => None,
        }
    }
}

/// A step's result, and whether it came from the log.
#[derive(Clone, Debug, PartialEq)]
pub struct Step<T> {
    /// The result.
    pub value: T,
    /// True when the log answered (the step was performed before, maybe by another process).
    pub replayed: bool,
    /// The try that produced it (above 1 after a try failed or its owner died first).
    pub attempt: u32,
    /// True when the result is a dead run's recorded outcome (its host died while the tool
    /// ran; recovery closed the run): closed in this call (`replayed` false) or before.
    pub recovered: bool,
}

/// What a step call does next.
enum Begun<'a> {
    /// The step has a result: the `session.step_completed` payload, and its position.
    Recorded(Value, u64),
    /// This call closed it from its dead run's outcome: the record it appended, and where.
    Closed(Value, u64),
    /// This caller performs it.
    Perform(Guard<'a>),
}

/// A claimed try being performed. Dropped before [`Guard::done`] (an error, a panic), it
/// records `session.step_failed`, so no caller waits on a try that is over: the next one
/// runs an inference again, and closes a tool run that started from its outcome.
struct Guard<'a> {
    session: &'a Session,
    step: String,
    kind: &'static str,
    attempt: u32,
    error: String,
    done: bool,
    // Dropped after `drop` ran: the claim lives until its end is recorded.
    _claim: Claim,
}

impl Guard<'_> {
    fn done(mut self) {
        self.done = true;
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let error = if self.error.is_empty() {
            "the try ended without a result (a panic, or its result could not be recorded)".into()
        } else {
            std::mem::take(&mut self.error)
        };
        let event = DomainEvent::SessionStepFailed {
            session_id: self.session.id.clone(),
            step: std::mem::take(&mut self.step),
            kind: self.kind.to_owned(),
            attempt: self.attempt,
            error,
        }
        .to_new_event();
        for _ in 0..3 {
            let appended = self.session.events.append(
                &self.session.stream,
                ExpectedVersion::Any,
                std::slice::from_ref(&event),
            );
            if appended.is_ok() {
                return;
            }
        }
        log::warn!(
            "session {}: the end of a failed try could not be recorded; other callers wait \
             until this process ends",
            self.session.id
        );
    }
}

/// One durable session. Cheap to share; every method takes `&self` and may be called from
/// many threads and processes at once.
pub struct Session {
    id: String,
    stream: String,
    events: Arc<dyn EventStore>,
    index: Mutex<Index>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Whether `id` may name a session (1 to [`MAX_STEP_KEY`] bytes, no control character): the
/// one rule every call naming a session applies.
///
/// # Errors
/// [`SessionError::InvalidRequest`] saying why not.
pub(crate) fn check_session_id(id: &str) -> Result<(), SessionError> {
    check_key("session id", id)
}

fn check_key(what: &str, key: &str) -> Result<(), SessionError> {
    if key.is_empty() || key.len() > MAX_STEP_KEY || key.chars().any(char::is_control) {
        return Err(SessionError::InvalidRequest(format!(
            "a {what} is 1 to {MAX_STEP_KEY} bytes without control characters, not {:?}",
            key.chars().take(80).collect::<String>()
        )));
    }
    Ok(())
}

/// How long a waiter sleeps between reads of another caller's step: short at first, for a
/// step about to end, then up to 50 ms.
fn backoff(round: u32) -> Duration {
    Duration::from_millis(u64::from(round.min(25)) * 2 + 1)
}

/// How often a step waiting for an approval decision reads the log: a decision from another
/// process starts the run within a few milliseconds (one short read per poll).
const PENDING_POLL: Duration = Duration::from_millis(2);

/// The largest signal payload, in bytes of JSON.
pub const MAX_SIGNAL_BYTES: usize = 1 << 20;

impl Session {
    /// Opens session `id` of `events`: reads its stream (`session-<id>`, where its tool runs
    /// are recorded too) once; later calls read only what was appended since.
    ///
    /// # Errors
    /// [`SessionError::InvalidRequest`] for an empty, over-long or control-character id;
    /// [`SessionError::Events`] / [`SessionError::Corrupt`] when the stream cannot be read.
    pub fn open(events: Arc<dyn EventStore>, id: &str) -> Result<Session, SessionError> {
        check_session_id(id)?;
        let session = Session {
            id: id.to_owned(),
            stream: session_stream(id),
            events,
            index: Mutex::new(Index::default()),
        };
        session.refresh(&mut session.index.lock())?;
        Ok(session)
    }

    /// The session's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn refresh(&self, ix: &mut Index) -> Result<(), SessionError> {
        loop {
            // Checked against the chain: a damaged record is Corrupt at its position, never
            // replayed altered nor taken for a step that is not there.
            let page = self
                .events
                .read_stream_verified(&self.stream, ix.version + 1, 1000)
                .map_err(|e| match e {
                    EventStoreError::CorruptEvent { position, detail } => {
                        SessionError::Corrupt { position, detail }
                    }
                    other => SessionError::Events(other),
                })?;
            for e in &page {
                ix.apply(e)?;
            }
            if page.len() < 1000 {
                return Ok(());
            }
        }
    }

    fn expected(version: u64) -> ExpectedVersion {
        if version == 0 {
            ExpectedVersion::NoStream
        } else {
            ExpectedVersion::Exact(version)
        }
    }

    /// Appends the event `build` makes from the current fold, at the version it saw; reads
    /// again and rebuilds when another append came first.
    fn append_at(
        &self,
        mut build: impl FnMut(&Index) -> Option<DomainEvent>,
    ) -> Result<Option<(Value, u64)>, SessionError> {
        loop {
            let mut ix = self.index.lock();
            self.refresh(&mut ix)?;
            let Some(event) = build(&ix) else {
                return Ok(None);
            };
            let new = event.to_new_event();
            let payload = new.payload.clone();
            match self
                .events
                .append(&self.stream, Self::expected(ix.version), &[new])
            {
                Ok(at) => return Ok(Some((payload, at.first_position))),
                Err(EventStoreError::WrongExpectedVersion { .. }) => continue,
                Err(e) => return Err(SessionError::Events(e)),
            }
        }
    }

    /// Finds the step's result, or claims it for this caller. `digest` is the request's;
    /// `also`, a digest an earlier version gave the same request, which a record may carry.
    /// A step whose run waits for an approval waits for its decision until `until`.
    fn begin(
        &self,
        step: &str,
        kind: &'static str,
        (digest, also): (&str, Option<&str>),
        run: Option<(&str, Option<&str>)>,
        until: Instant,
        cancel: &CancelToken,
    ) -> Result<Begun<'_>, SessionError> {
        check_key("step key", step)?;
        let mut round = 0;
        loop {
            let mut ix = self.index.lock();
            self.refresh(&mut ix)?;
            let state = ix.steps.get(step).cloned();
            if let Some(s) = &state {
                if s.digest() != digest && Some(s.digest()) != also {
                    return Err(SessionError::Conflict {
                        step: step.to_owned(),
                        recorded: s.digest().to_owned(),
                        requested: digest.to_owned(),
                    });
                }
            }
            // A key that waits for a signal is that wait's.
            if let Some(name) = ix.waits.get(step) {
                return Err(SessionError::Conflict {
                    step: step.to_owned(),
                    recorded: digest::of_wait(name),
                    requested: digest.to_owned(),
                });
            }
            let attempt = match next_try(&ix, step, state)? {
                NextTry::Recorded(payload, at) => return Ok(Begun::Recorded(payload, at)),
                NextTry::Wait => {
                    drop(ix);
                    if cancel.is_cancelled() {
                        return Err(SessionError::Cancelled);
                    }
                    std::thread::sleep(backoff(round));
                    round = round.saturating_add(1);
                    continue;
                }
                NextTry::Claim(a) => a,
                NextTry::Pending {
                    request_id,
                    deadline_ms,
                } => {
                    drop(ix);
                    if cancel.is_cancelled() {
                        return Err(SessionError::Cancelled);
                    }
                    if Instant::now() >= until {
                        return Err(SessionError::Pending {
                            step: step.to_owned(),
                            request_id,
                            deadline_ms,
                        });
                    }
                    std::thread::sleep(PENDING_POLL.min(until - Instant::now()));
                    continue;
                }
                NextTry::Expire(request_id) => {
                    drop(ix);
                    self.expire(&request_id)?;
                    continue;
                }
                NextTry::Close {
                    attempt,
                    run: id,
                    call_id,
                } => {
                    drop(ix);
                    return self.close_from_outcome(step, kind, digest, attempt, id, call_id);
                }
            };
            if cancel.is_cancelled() {
                return Err(SessionError::Cancelled);
            }
            // A host-chosen invocation id that already ran would tie this step to that run.
            if let Some((id, _)) = run {
                if ix.runs.get(id).is_some_and(|r| r.started) {
                    return Err(SessionError::InvalidRequest(format!(
                        "invocation id {id:?} already ran in session {:?}; give each step's run \
                         a fresh one",
                        self.id
                    )));
                }
            }
            if let Some(begun) = self.claim(&ix, step, kind, digest, attempt, run)? {
                return Ok(begun);
            }
        }
    }

    /// Claims try `attempt` of the step at the version `ix` read: `None` when another append
    /// came first (read again).
    fn claim(
        &self,
        ix: &Index,
        step: &str,
        kind: &'static str,
        digest: &str,
        attempt: u32,
        run: Option<(&str, Option<&str>)>,
    ) -> Result<Option<Begun<'_>>, SessionError> {
        let claim = Claim::new();
        let event = DomainEvent::SessionStepStarted {
            session_id: self.id.clone(),
            step: step.to_owned(),
            kind: kind.to_owned(),
            digest: digest.to_owned(),
            attempt,
            owner: claim.owner(),
            invocation_id: run.map(|(id, _)| id.to_owned()),
            call_id: run.and_then(|(_, c)| c.map(str::to_owned)),
        };
        match self.events.append(
            &self.stream,
            Self::expected(ix.version),
            &[event.to_new_event()],
        ) {
            Ok(_) => Ok(Some(Begun::Perform(Guard {
                session: self,
                step: step.to_owned(),
                kind,
                attempt,
                error: String::new(),
                done: false,
                _claim: claim,
            }))),
            Err(EventStoreError::WrongExpectedVersion { .. }) => Ok(None),
            Err(e) => Err(SessionError::Events(e)),
        }
    }

    /// The recorded result of `step`, if it has one.
    fn recorded(&self, step: &str) -> Option<(Value, u64)> {
        match self.index.lock().steps.get(step) {
            Some(StepState::Done {
                payload, position, ..
            }) => Some((payload.clone(), *position)),
            _ => None,
        }
    }

    /// Closes a tool step whose owner died after its run started, with the run's outcome.
    fn close_from_outcome(
        &self,
        step: &str,
        kind: &str,
        digest: &str,
        attempt: u32,
        run: String,
        call_id: Option<String>,
    ) -> Result<Begun<'_>, SessionError> {
        let mut in_doubt = false;
        let payload = self.append_at(|ix| {
            if let Some(StepState::Done { .. }) = ix.steps.get(step) {
                return None;
            }
            let Some(seen) = ix.runs.get(&run).filter(|r| r.outcome.is_some()) else {
                in_doubt = true;
                return None;
            };
            let outcome = seen.outcome.clone()?;
            in_doubt = false;
            let result = result_from_outcome(&run, &outcome, seen.recovered.as_deref());
            Some(DomainEvent::SessionStepCompleted {
                session_id: self.id.clone(),
                step: step.to_owned(),
                kind: kind.to_owned(),
                digest: digest.to_owned(),
                attempt,
                answer: None,
                context: None,
                result: Some(serde_json::to_value(&result).unwrap_or(Value::Null)),
                call_id: call_id.clone(),
                recovered: Some(outcome.type_id().to_owned()),
                signal: None,
            })
        })?;
        if in_doubt {
            return Err(SessionError::InDoubt {
                step: step.to_owned(),
                invocation_id: run,
            });
        }
        match payload {
            Some((p, at)) => Ok(Begun::Closed(p, at)),
            // Closed meanwhile by another caller: its record answers.
            None => self
                .recorded(step)
                .map(|(p, at)| Begun::Recorded(p, at))
                .ok_or(SessionError::InDoubt {
                    step: step.to_owned(),
                    invocation_id: run,
                }),
        }
    }

    /// Performs inference step `step` once: the first call asks `model` and records the
    /// answer; a later call with the same key and request returns the recorded answer
    /// without asking (`replayed`). A request that names no session is sent as this
    /// session's (so a model's prompt cache keeps the conversation).
    ///
    /// # Errors
    /// [`SessionError::Conflict`] when the key was used for another request;
    /// [`SessionError::Inference`] when the model failed (nothing recorded as the result:
    /// the next call tries again); others as [`SessionError`] says.
    pub fn infer(
        &self,
        step: &str,
        model: &dyn InferenceProvider,
        request: &InferenceRequest,
        cancel: &CancelToken,
    ) -> Result<Step<InferenceResponse>, SessionError> {
        self.infer_stream(step, model, request, cancel, &mut |_| {
            StreamControl::Continue
        })
    }

    /// As [`Session::infer`], handing each piece of a new answer to `on_chunk` as it
    /// arrives; a replayed answer comes to `on_chunk` whole, its reasoning first.
    ///
    /// # Errors
    /// As [`Session::infer`].
    pub fn infer_stream(
        &self,
        step: &str,
        model: &dyn InferenceProvider,
        request: &InferenceRequest,
        cancel: &CancelToken,
        on_chunk: &mut dyn FnMut(StreamChunk<'_>) -> StreamControl,
    ) -> Result<Step<InferenceResponse>, SessionError> {
        let digest = digest::of_inference(model.id().as_str(), request);
        let legacy = digest::of_inference_without_model(request);
        let mut guard = match self.begin(
            step,
            digest::INFER,
            (&digest, Some(&legacy)),
            None,
            Instant::now(),
            cancel,
        )? {
            Begun::Recorded(payload, at) | Begun::Closed(payload, at) => {
                let value = recorded_answer(&payload, at)?;
                replay_chunks(&value, on_chunk);
                return Ok(Step {
                    value,
                    replayed: true,
                    attempt: attempt_of(&payload),
                    recovered: false,
                });
            }
            Begun::Perform(guard) => guard,
        };
        let attempt = guard.attempt;
        // The model hears which conversation this is (a prompt cache keeps it), unless the
        // host named another; the digest is of the request as the host sent it.
        let keyed;
        let sent = if request.session.is_none() {
            keyed = InferenceRequest {
                session: Some(self.id.clone()),
                ..request.clone()
            };
            &keyed
        } else {
            request
        };
        let answer = match model.infer_stream(sent, cancel, on_chunk) {
            Ok(a) => a,
            Err(e) => {
                // The guard records the failed try: the next call runs it again.
                guard.error = e.to_string();
                return Err(SessionError::Inference(e));
            }
        };
        let recorded = serde_json::to_value(&answer).unwrap_or(Value::Null);
        let completed = |ix: &Index| DomainEvent::SessionStepCompleted {
            session_id: self.id.clone(),
            step: step.to_owned(),
            kind: digest::INFER.into(),
            digest: digest.clone(),
            attempt,
            answer: Some(recorded.clone()),
            context: Some(fold::context_delta(&ix.context, &request.context)),
            result: None,
            call_id: None,
            recovered: None,
            signal: None,
        };
        self.record(guard, step, completed, answer, recorded_answer)
    }

    /// Records a performed step's result (the event `completed` makes from the current fold)
    /// and ends its try. When another try recorded the step first (this one was judged over),
    /// that record is the step's result, so caller and log agree.
    fn record<T>(
        &self,
        guard: Guard<'_>,
        step: &str,
        completed: impl Fn(&Index) -> DomainEvent,
        value: T,
        read: fn(&Value, u64) -> Result<T, SessionError>,
    ) -> Result<Step<T>, SessionError> {
        let attempt = guard.attempt;
        // Unrecorded (the log failed), the guard ends the try: the next call runs an inference
        // again and closes a tool run from its recorded outcome.
        let appended = self.append_at(|ix| (!ix.recorded(step)).then(|| completed(ix)))?;
        guard.done();
        if appended.is_none() {
            if let Some((payload, at)) = self.recorded(step) {
                return Ok(Step {
                    value: read(&payload, at)?,
                    replayed: true,
                    attempt: attempt_of(&payload),
                    recovered: payload["recovered"].is_string(),
                });
            }
        }
        Ok(Step {
            value,
            replayed: false,
            attempt,
            recovered: false,
        })
    }

    /// Performs tool step `step` once through `tools` (approval, sandbox, backup, events as
    /// any run): the first call runs `request` and records its result; a later call with the
    /// same key and request returns the recorded result without running it (`replayed`).
    /// `call_id` is the model's tool call this answers: the result joins the transcript
    /// under it. The request's `session_id` must be this session's.
    ///
    /// When the host died while the run was under way, the step answers with the run's
    /// recorded outcome (kind `interrupted` when recovery closed it), never running it again.
    /// That holds for an executor that records its runs in the session's stream, as
    /// [`crate::SandboxedToolExecutor`] does (the runtime's); a run another executor left
    /// unrecorded looks never started, and runs again.
    ///
    /// When the run needs a durable approval decision (the engine deferred), the step returns
    /// [`SessionError::Pending`] at once; see [`Session::execute_waiting`] to wait for it.
    ///
    /// # Errors
    /// [`SessionError::Conflict`] when the key was used for another request;
    /// [`SessionError::InvalidRequest`] for a request of another session;
    /// [`SessionError::InDoubt`] when the run's owner died and no recovery has closed it yet;
    /// [`SessionError::Pending`] while its run waits for an approval decision.
    pub fn execute(
        &self,
        step: &str,
        tools: &dyn ToolExecutor,
        request: &ToolRequest,
        call_id: Option<&str>,
        cancel: &CancelToken,
    ) -> Result<Step<ToolResult>, SessionError> {
        self.execute_waiting(step, tools, request, call_id, Duration::ZERO, cancel)
    }

    /// As [`Session::execute`], waiting up to `wait` for an approval decision the run needs
    /// (reading the log every few milliseconds; a decision from any process starts the run),
    /// then [`SessionError::Pending`]. A request recorded by an earlier call of the step (any
    /// process) is the one waited for: the run keeps that call's invocation id.
    ///
    /// # Errors
    /// As [`Session::execute`]; [`SessionError::Cancelled`] when `cancel` ends the wait.
    pub fn execute_waiting(
        &self,
        step: &str,
        tools: &dyn ToolExecutor,
        request: &ToolRequest,
        call_id: Option<&str>,
        wait: Duration,
        cancel: &CancelToken,
    ) -> Result<Step<ToolResult>, SessionError> {
        if request.session_id.as_str() != self.id {
            return Err(SessionError::InvalidRequest(format!(
                "the tool request is for session {:?}, not {:?}",
                request.session_id.as_str(),
                self.id
            )));
        }
        let until = Instant::now() + wait;
        let digest = digest::of_tool(request, call_id);
        let mut recovered_once = false;
        loop {
            let request = self.asked_as(step, request)?;
            let run = Some((request.invocation_id.as_str(), call_id));
            let mut guard =
                match self.begin(step, digest::TOOL, (&digest, None), run, until, cancel) {
                    Ok(Begun::Recorded(payload, at)) => {
                        return Ok(Step {
                            value: recorded_result(&payload, at)?,
                            replayed: true,
                            attempt: attempt_of(&payload),
                            recovered: payload["recovered"].is_string(),
                        })
                    }
                    Ok(Begun::Closed(payload, at)) => {
                        return Ok(Step {
                            value: recorded_result(&payload, at)?,
                            replayed: false,
                            attempt: attempt_of(&payload),
                            recovered: true,
                        })
                    }
                    Ok(Begun::Perform(guard)) => guard,
                    // The run's owner died and no recovery has closed it: the executor
                    // recovers dead runs now (their journals' locks are free), then the step
                    // is closed from the outcome that recorded.
                    Err(SessionError::InDoubt { .. }) if !recovered_once => {
                        recovered_once = true;
                        tools.recover_dead();
                        continue;
                    }
                    Err(e) => return Err(e),
                };
            let attempt = guard.attempt;
            let result = tools.execute_cancellable(&request, cancel);
            if result.error_kind() == Some(ToolErrorKind::Pending) {
                // Nothing ran: the try ends (recorded), and the step waits for the decision.
                guard.error = "waiting for an approval decision".into();
                drop(guard);
                if Instant::now() >= until {
                    let approval = result.data().map(|d| &d["approval"]);
                    return Err(SessionError::Pending {
                        step: step.to_owned(),
                        request_id: approval
                            .and_then(|a| a["request_id"].as_str())
                            .unwrap_or(request.invocation_id.as_str())
                            .to_owned(),
                        deadline_ms: approval.and_then(|a| a["deadline_ms"].as_i64()),
                    });
                }
                continue;
            }
            let recorded = serde_json::to_value(&result).unwrap_or(Value::Null);
            let completed = |_: &Index| DomainEvent::SessionStepCompleted {
                session_id: self.id.clone(),
                step: step.to_owned(),
                kind: digest::TOOL.into(),
                digest: digest.clone(),
                attempt,
                answer: None,
                context: None,
                result: Some(recorded.clone()),
                call_id: call_id.map(str::to_owned),
                recovered: None,
                signal: None,
            };
            return self.record(guard, step, completed, result, recorded_result);
        }
    }

    /// `request` as the step's next try runs it: under the invocation id of an earlier try
    /// that asked for an approval (the request, and its decision, belong to that id).
    fn asked_as<'r>(
        &self,
        step: &str,
        request: &'r ToolRequest,
    ) -> Result<std::borrow::Cow<'r, ToolRequest>, SessionError> {
        let mut ix = self.index.lock();
        self.refresh(&mut ix)?;
        let earlier = match ix.steps.get(step) {
            Some(StepState::Claimed { invocation_id, .. })
            | Some(StepState::Failed { invocation_id, .. }) => invocation_id.as_deref(),
            _ => None,
        };
        Ok(match earlier {
            Some(id) if id != request.invocation_id.as_str() && ix.approvals.get(id).is_some() => {
                let mut asked = request.clone();
                asked.invocation_id = crate::ids::ToolInvocationId::from_string(id);
                std::borrow::Cow::Owned(asked)
            }
            _ => std::borrow::Cow::Borrowed(request),
        })
    }

    /// Records approval request `request_id` `expired` (its deadline passed), unless it was
    /// decided meanwhile.
    fn expire(&self, request_id: &str) -> Result<(), SessionError> {
        self.append_at(|ix| {
            let asked = ix.approvals.get(request_id)?;
            asked.decision.is_none().then(|| {
                crate::approvals::decision_event(
                    asked,
                    "expired",
                    "deadline",
                    Some(crate::approvals::expired_reason(asked)),
                    None,
                    crate::approvals::now_ms(),
                )
            })
        })?;
        Ok(())
    }

    /// Waits for signal `name` as step `step`, once: the first call records that the step
    /// waits (`session.waiting`); a signal from any process ([`Session::signal`]) answers
    /// it, and the step records its payload, so a later call with the key returns it
    /// (`replayed`) without waiting. Waits up to `wait` (reading the log every few
    /// milliseconds), then [`SessionError::Waiting`]: the host may exit and call the step
    /// again from any process.
    ///
    /// # Errors
    /// [`SessionError::InvalidRequest`] for a malformed key or name;
    /// [`SessionError::Conflict`] when the key was used for another request (or another
    /// signal); [`SessionError::Waiting`]; [`SessionError::Cancelled`]; as [`Session::open`].
    pub fn wait(
        &self,
        step: &str,
        name: &str,
        wait: Duration,
        cancel: &CancelToken,
    ) -> Result<Step<Value>, SessionError> {
        check_key("step key", step)?;
        check_key("signal name", name)?;
        let digest = digest::of_wait(name);
        let until = Instant::now() + wait;
        loop {
            let (signal, waiting) = {
                let mut ix = self.index.lock();
                self.refresh(&mut ix)?;
                let recorded = ix
                    .steps
                    .get(step)
                    .map(|s| s.digest().to_owned())
                    .or_else(|| ix.waits.get(step).map(|n| digest::of_wait(n)));
                if let Some(recorded) = recorded.filter(|d| *d != digest) {
                    return Err(SessionError::Conflict {
                        step: step.to_owned(),
                        recorded,
                        requested: digest,
                    });
                }
                if let Some(StepState::Done { payload, .. }) = ix.steps.get(step) {
                    return Ok(Step {
                        value: payload["signal"].clone(),
                        replayed: true,
                        attempt: attempt_of(payload),
                        recovered: false,
                    });
                }
                (
                    ix.signals.get(name).map(|(p, _)| p.clone()),
                    ix.waits.contains_key(step),
                )
            };
            if let Some(payload) = signal {
                let completed = |ix: &Index| {
                    (!ix.recorded(step)).then(|| DomainEvent::SessionStepCompleted {
                        session_id: self.id.clone(),
                        step: step.to_owned(),
                        kind: digest::WAIT.into(),
                        digest: digest.clone(),
                        attempt: 1,
                        answer: None,
                        context: None,
                        result: None,
                        call_id: None,
                        recovered: None,
                        signal: Some(payload.clone()),
                    })
                };
                if self.append_at(completed)?.is_some() {
                    return Ok(Step {
                        value: payload,
                        replayed: false,
                        attempt: 1,
                        recovered: false,
                    });
                }
                // Recorded by another caller meanwhile: the loop returns its record.
                continue;
            }
            if !waiting {
                self.append_at(|ix| {
                    (!ix.waits.contains_key(step) && !ix.recorded(step)).then(|| {
                        DomainEvent::SessionWaiting {
                            session_id: self.id.clone(),
                            step: step.to_owned(),
                            name: name.to_owned(),
                        }
                    })
                })?;
            }
            if cancel.is_cancelled() {
                return Err(SessionError::Cancelled);
            }
            let now = Instant::now();
            if now >= until {
                return Err(SessionError::Waiting {
                    step: step.to_owned(),
                    name: name.to_owned(),
                });
            }
            std::thread::sleep(PENDING_POLL.min(until - now));
        }
    }

    /// Sends signal `name` to the session's waits (recorded as `session.signaled`, with `by`,
    /// the sender as it names itself): every wait step for it, in any process, now or
    /// later, records `payload` as its answer. Returns the signal's position in the log.
    ///
    /// # Errors
    /// [`SessionError::InvalidRequest`] for a malformed name, a `by` over 256 bytes or a
    /// payload over 1 MiB; [`SessionError::AlreadySignaled`] when one of the name was sent
    /// (the first wins); as [`Session::open`].
    pub fn signal(
        &self,
        name: &str,
        payload: Value,
        by: Option<&str>,
    ) -> Result<u64, SessionError> {
        check_key("signal name", name)?;
        if let Some(by) = by {
            check_key("sender name", by)?;
        }
        let size = serde_json::to_vec(&payload).map_or(0, |b| b.len());
        if size > MAX_SIGNAL_BYTES {
            return Err(SessionError::InvalidRequest(format!(
                "a signal's payload is at most {MAX_SIGNAL_BYTES} bytes of JSON, not {size}"
            )));
        }
        let mut first = None;
        let appended = self.append_at(|ix| match ix.signals.get(name) {
            Some((_, at)) => {
                first = Some(*at);
                None
            }
            None => Some(DomainEvent::SessionSignaled {
                session_id: self.id.clone(),
                name: name.to_owned(),
                payload: payload.clone(),
                by: by.map(str::to_owned),
            }),
        })?;
        match appended {
            Some((_, at)) => Ok(at),
            None => Err(SessionError::AlreadySignaled {
                name: name.to_owned(),
                position: first.unwrap_or(0),
            }),
        }
    }

    /// The conversation as the log tells it: the last inference's context (its system prompt,
    /// task and entries, as the host sent them), its answer as a `model` entry with its tool
    /// calls, and each tool step since that answers a call id as a `tool` entry (a retry
    /// under a new key with the same call id replaces it). A new process continues the
    /// conversation from it.
    ///
    /// # Errors
    /// As [`Session::open`].
    pub fn transcript(&self) -> Result<ContextPack, SessionError> {
        let mut ix = self.index.lock();
        self.refresh(&mut ix)?;
        Ok(ix.transcript())
    }
}

/// What the fold says comes next for a step.
enum NextTry {
    /// The step has a result: the `session.step_completed` payload, and its position.
    Recorded(Value, u64),
    /// Another live caller holds the claim: wait for its result.
    Wait,
    /// This caller claims it, as this try.
    Claim(u32),
    /// Its run waits for a decision on this approval request.
    Pending {
        request_id: String,
        deadline_ms: Option<i64>,
    },
    /// Its run's approval request is past its deadline: record it `expired`, then go on.
    Expire(String),
    /// Its owner died after its tool run started: close it from the run's outcome.
    Close {
        attempt: u32,
        run: String,
        call_id: Option<String>,
    },
}

/// What comes next for `step`, in `state` as `ix` says; [`SessionError::InProgress`] when
/// its owner's liveness cannot be told.
fn next_try(ix: &Index, step: &str, state: Option<StepState>) -> Result<NextTry, SessionError> {
    // A try that is over: a tool run that started is closed from its outcome (never
    // run again); anything else had no side effect and is tried again.
    let over = |attempt: u32, invocation: Option<String>, call: Option<String>| match invocation {
        Some(id) if ix.runs.get(&id).is_some_and(|r| r.started) => NextTry::Close {
            attempt,
            run: id,
            call_id: call,
        },
        // Its run asked for a decision: it waits for one, and is tried again once there is.
        Some(id) => match ix.approvals.get(&id) {
            Some(asked) if asked.overdue(crate::approvals::now_ms()) => NextTry::Expire(id),
            Some(asked) if asked.decision.is_none() => NextTry::Pending {
                request_id: id,
                deadline_ms: asked.deadline_ms,
            },
            _ => NextTry::Claim(attempt.saturating_add(1)),
        },
        None => NextTry::Claim(attempt.saturating_add(1)),
    };
    Ok(match state {
        None => NextTry::Claim(1),
        Some(StepState::Done {
            payload, position, ..
        }) => NextTry::Recorded(payload, position),
        Some(StepState::Failed {
            attempt,
            invocation_id,
            call_id,
            ..
        }) => over(attempt, invocation_id, call_id),
        Some(StepState::Claimed {
            attempt,
            owner,
            invocation_id,
            call_id,
            ..
        }) => match owner::judge(&owner) {
            Liveness::Alive => NextTry::Wait,
            Liveness::Unknown => {
                return Err(SessionError::InProgress {
                    step: step.to_owned(),
                })
            }
            Liveness::Dead => over(attempt, invocation_id, call_id),
        },
    })
}

fn attempt_of(payload: &Value) -> u32 {
    payload["attempt"]
        .as_u64()
        .and_then(|a| u32::try_from(a).ok())
        .unwrap_or(1)
}

/// A step's recorded answer, from its record at `position`.
fn recorded_answer(payload: &Value, position: u64) -> Result<InferenceResponse, SessionError> {
    serde_json::from_value(payload["answer"].clone()).map_err(|e| SessionError::Corrupt {
        position,
        detail: format!("step {}: its answer: {e}", payload["step"]),
    })
}

/// A step's recorded tool result, from its record at `position`.
fn recorded_result(payload: &Value, position: u64) -> Result<ToolResult, SessionError> {
    serde_json::from_value(payload["result"].clone()).map_err(|e| SessionError::Corrupt {
        position,
        detail: format!("step {}: its result: {e}", payload["step"]),
    })
}

fn replay_chunks(
    answer: &InferenceResponse,
    on_chunk: &mut dyn FnMut(StreamChunk<'_>) -> StreamControl,
) {
    use crate::inference::ChunkKind;
    if let Some(r) = answer.reasoning.as_deref().filter(|r| !r.is_empty()) {
        if on_chunk(StreamChunk {
            kind: ChunkKind::Reasoning,
            text: r,
        }) == StreamControl::Stop
        {
            return;
        }
    }
    if !answer.text.is_empty() {
        on_chunk(StreamChunk {
            kind: ChunkKind::Text,
            text: &answer.text,
        });
    }
}

/// The result a tool step answers with when its owner died and only the run's outcome event
/// is left: what that event says (the tool's output died with the host).
fn result_from_outcome(run: &str, outcome: &DomainEvent, staged: Option<&str>) -> ToolResult {
    let id = crate::ids::ToolInvocationId::from_string(run);
    let lost = "the host died before the tool's output was recorded";
    // `state` says where the files are: `completed` (the change is in place), `restored`
    // (put back as they were), `unchanged` (never touched), `kept` (a staged change set held
    // for the host), `unknown`.
    let data = |state: &str| json!({"recovered_from": outcome.type_id(), "state": state});
    match outcome {
        // One shape for a run whose change is in place but whose output died with the host,
        // whether its completion was recorded or recovery found it committed.
        DomainEvent::ToolExecutionCompleted { .. } => ToolResult::failure_of(
            &id,
            ToolErrorKind::Interrupted,
            format!(
                "interrupted by a crash after it completed: its change is in place, but {lost}"
            ),
            Recoverable::Yes,
        )
        .with_data(data("completed")),
        _ => {
            let (kind, reason, recoverable, state) = failure_from_outcome(outcome, staged, lost);
            ToolResult::failure_of(&id, kind, reason, recoverable).with_data(data(state))
        }
    }
}

/// The failure an outcome other than `completed` answers with: its kind, reason, whether it
/// may be tried again, and the `state` its files are in (see [`result_from_outcome`]).
fn failure_from_outcome(
    outcome: &DomainEvent,
    staged: Option<&str>,
    lost: &str,
) -> (ToolErrorKind, String, Recoverable, &'static str) {
    match outcome {
        // A staged run's working dirs are where recovery settled its change set.
        DomainEvent::ToolExecutionInterrupted { .. } if staged.is_some() => {
            let (why, state) = match staged {
                Some("promoted") => (
                    "its staged change set had been promoted: it is in place",
                    "completed",
                ),
                Some("kept") => ("its staged change set is held for the host", "kept"),
                _ => (
                    "its staged change set was discarded: its working dirs are as they were",
                    "unchanged",
                ),
            };
            (
                ToolErrorKind::Interrupted,
                format!("interrupted by a crash; {why}, but {lost}"),
                Recoverable::Yes,
                state,
            )
        }
        DomainEvent::ToolExecutionInterrupted { state, .. } if state == "completed" => (
            ToolErrorKind::Interrupted,
            format!(
                "interrupted by a crash after it completed: its change is in place, but {lost}"
            ),
            Recoverable::Yes,
            "completed",
        ),
        // Recovery restores the files a tool declared; a command's other effects (a shell
        // run's, an MCP server's) it cannot see, so for those nothing is promised.
        DomainEvent::ToolExecutionInterrupted { tool_name, .. }
            if tool_name.starts_with("file_") =>
        {
            (
                ToolErrorKind::Interrupted,
                "interrupted by a crash before it changed anything".into(),
                Recoverable::Yes,
                "unchanged",
            )
        }
        DomainEvent::ToolExecutionInterrupted { .. } => (
            ToolErrorKind::Interrupted,
            "interrupted by a crash; recovery found no declared file changed, but what the \
             command did besides is unknown"
                .into(),
            Recoverable::Yes,
            "unknown",
        ),
        DomainEvent::ToolExecutionCancelled { .. } => (
            ToolErrorKind::Cancelled,
            "cancelled; its files were restored".into(),
            Recoverable::Yes,
            "restored",
        ),
        DomainEvent::ToolExecutionRejected { reason, .. } => (
            ToolErrorKind::NotAllowed,
            reason.clone(),
            Recoverable::No,
            "unchanged",
        ),
        DomainEvent::ToolExecutionFailed {
            reason,
            recoverable,
            kind,
            ..
        } => {
            if reason == "interrupted" && kind.is_none() {
                return (
                    ToolErrorKind::Interrupted,
                    "interrupted by a crash; its files were restored".into(),
                    Recoverable::Yes,
                    "restored",
                );
            }
            let kind = kind
                .as_deref()
                .and_then(|k| serde_json::from_value(json!(k)).ok())
                .unwrap_or_default();
            (
                kind,
                reason.clone(),
                Recoverable::from(*recoverable),
                "restored",
            )
        }
        // The fold keeps only the five outcome types above (`completed` in `result_from_outcome`).
        other => (
            ToolErrorKind::Other,
            format!("{} is not a run's outcome", other.type_id()),
            Recoverable::No,
            "unknown",
        ),
    }
}
