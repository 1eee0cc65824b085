//! Background jobs: programs a shell request started with `"background": true`, confined and
//! contained like any shell run, that outlive the call. The [`JobTable`] keeps each job's
//! output (the last bytes of each stream, read by cursor), waits for, signals and stops them,
//! and records each start and end in the session's stream (`job.started`, `job.exited`).
//!
//! A job ends on its own, at its timeout, when asked to ([`JobTable::stop`]), when its session
//! ends ([`JobTable::end_session`]) or when the table is dropped (the runtime closes); in every
//! case every process it started is gone before its end is recorded. A host that dies takes
//! its jobs with it (their supervisors watch a pipe only the host holds), and the next table
//! opened on the same sandbox root records those jobs `interrupted`.

mod buffer;
mod record;

use crate::cancel::CancelToken;
use crate::domain::session_stream;
use crate::domain::{DomainEvent, EventType};
use crate::events::{EventStore, ExpectedVersion};
use crate::sys::spawn::{Exit, Started};
use crate::tools::shell::background::{Background, Launch, Reserved};
use buffer::Tail;
use parking_lot::{Condvar, Mutex};
use std::fmt;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Ended jobs kept per session for their last output, beyond which the oldest is forgotten.
const KEPT_ENDED: usize = 16;
/// Ended jobs kept in all, beyond which the oldest is forgotten whatever its session.
const KEPT_ENDED_TOTAL: usize = 256;

/// `now + d`, or `None` when that is past what the clock can hold (wait without a deadline).
fn deadline_after(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

/// Why a job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobEndReason {
    /// Its program exited (or was killed by a signal no one here sent).
    Exited,
    /// [`JobTable::stop`] stopped it.
    Stopped,
    /// Its timeout passed.
    TimedOut,
    /// Its session ended ([`JobTable::end_session`]).
    SessionEnded,
    /// The runtime closed.
    RuntimeClosed,
}

impl JobEndReason {
    /// The recorded spelling: `exited`, `stopped`, `timed_out`, `session_ended`,
    /// `runtime_closed`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobEndReason::Exited => "exited",
            JobEndReason::Stopped => "stopped",
            JobEndReason::TimedOut => "timed_out",
            JobEndReason::SessionEnded => "session_ended",
            JobEndReason::RuntimeClosed => "runtime_closed",
        }
    }
}

/// Where a job is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobStatus {
    /// Still running.
    Running {
        /// Since its start.
        elapsed: Duration,
    },
    /// Ended; every process of it is gone.
    Ended {
        /// Why.
        reason: JobEndReason,
        /// Its exit code, when it exited.
        exit_code: Option<i32>,
        /// The signal that ended it, when one did.
        signal: Option<i32>,
        /// From its start to its end.
        duration: Duration,
    },
}

impl JobStatus {
    /// As JSON: `{"state": "running", "elapsed_ms"}` or `{"state": "ended", "reason",
    /// "exit_code", "signal", "duration_ms"}`.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            JobStatus::Running { elapsed } => serde_json::json!({
                "state": "running", "elapsed_ms": elapsed.as_millis() as u64,
            }),
            JobStatus::Ended {
                reason,
                exit_code,
                signal,
                duration,
            } => serde_json::json!({
                "state": "ended", "reason": reason.as_str(), "exit_code": exit_code,
                "signal": signal, "duration_ms": duration.as_millis() as u64,
            }),
        }
    }
}

/// Where a reader is in a job's two streams: bytes of stdout and of stderr read so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobCursor {
    /// Bytes of stdout read so far.
    pub stdout: u64,
    /// Bytes of stderr read so far.
    pub stderr: u64,
}

/// What [`JobTable::read`] got: each stream's bytes since the cursor, the cursor to read from
/// next, and the bytes written past the cursor that the job's buffer no longer held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobOutput {
    /// New stdout.
    pub stdout: Vec<u8>,
    /// New stderr.
    pub stderr: Vec<u8>,
    /// Where to read from next.
    pub cursor: JobCursor,
    /// Stdout bytes after the cursor that were dropped before this read.
    pub stdout_dropped: u64,
    /// As `stdout_dropped`, for stderr.
    pub stderr_dropped: u64,
    /// The job's status at the read (ended: nothing more will come after this read's bytes
    /// once a read returns none).
    pub status: JobStatus,
}

/// One job, as [`JobTable::list`] shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobInfo {
    /// Its id.
    pub job_id: String,
    /// Its session.
    pub session_id: String,
    /// The command.
    pub command: Vec<String>,
    /// Where it is.
    pub status: JobStatus,
}

/// Why a job request failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum JobError {
    /// No job of this id in this session (never started, or its session's ended jobs were
    /// forgotten).
    Unknown {
        /// The id asked for.
        job_id: String,
    },
    /// The session already runs its most jobs: stop one first.
    TooMany {
        /// The session.
        session_id: String,
        /// The bound (`tools.shell.jobs.max_per_session`).
        max: usize,
    },
    /// Not a signal a job may be sent.
    BadSignal {
        /// The name given.
        given: String,
    },
    /// The runtime is closing: no job starts.
    Closed,
    /// The log refused the job's record, or a system call failed.
    Failed {
        /// What failed.
        reason: String,
    },
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::Unknown { job_id } => {
                write!(f, "no job {job_id:?} in this session; list them with the jobs tool's \"list\"")
            }
            JobError::TooMany { session_id, max } => write!(
                f,
                "session {session_id:?} already runs {max} background jobs (tools.shell.jobs.max_per_session); stop one first"
            ),
            JobError::BadSignal { given } => write!(
                f,
                "{given:?} is not a signal a job may be sent; one of: {}",
                SIGNALS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            ),
            JobError::Closed => f.write_str("the runtime is closing; no job starts"),
            JobError::Failed { reason } => f.write_str(reason),
        }
    }
}

impl std::error::Error for JobError {}

/// The signals a job may be sent, by name.
pub const SIGNALS: &[(&str, i32)] = &[
    ("INT", libc::SIGINT),
    ("TERM", libc::SIGTERM),
    ("KILL", libc::SIGKILL),
    ("HUP", libc::SIGHUP),
    ("QUIT", libc::SIGQUIT),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("STOP", libc::SIGSTOP),
    ("CONT", libc::SIGCONT),
];

/// The number of a signal name (`TERM` or `SIGTERM`, any case).
///
/// # Errors
/// [`JobError::BadSignal`] for a name not in [`SIGNALS`].
pub fn signal_number(name: &str) -> Result<i32, JobError> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    SIGNALS
        .iter()
        .find(|(n, _)| *n == bare)
        .map(|(_, s)| *s)
        .ok_or_else(|| JobError::BadSignal {
            given: name.to_owned(),
        })
}

struct Job {
    id: String,
    session: String,
    command: Vec<String>,
    started: Instant,
    out: Mutex<[Tail; 2]>,
    /// `None` while running.
    end: Mutex<Option<JobStatus>>,
    ended: Condvar,
    /// Set before `cancel`, so the end is recorded with why it was asked for.
    asked: Mutex<Option<JobEndReason>>,
    cancel: CancelToken,
    /// The program's process, until the job has ended.
    pidfd: Mutex<Option<OwnedFd>>,
}

impl Job {
    fn status(&self) -> JobStatus {
        self.end.lock().clone().unwrap_or(JobStatus::Running {
            elapsed: self.started.elapsed(),
        })
    }

    fn running(&self) -> bool {
        self.end.lock().is_none()
    }

    /// Waits up to `timeout` for the end; the status then.
    fn wait(&self, timeout: Duration) -> JobStatus {
        let deadline = deadline_after(timeout);
        let mut end = self.end.lock();
        while end.is_none() {
            match deadline {
                Some(d) => {
                    if self.ended.wait_until(&mut end, d).timed_out() {
                        break;
                    }
                }
                None => self.ended.wait(&mut end),
            }
        }
        end.clone().unwrap_or(JobStatus::Running {
            elapsed: self.started.elapsed(),
        })
    }

    fn signal(&self, signal: i32) -> Result<(), JobError> {
        if !self.running() {
            return Ok(()); // nothing left to signal
        }
        let pidfd = self.pidfd.lock();
        let Some(fd) = pidfd.as_ref() else {
            return Err(JobError::Failed {
                reason: format!(
                    "job {}: its program could not be addressed (it may have exited; its other processes are still being stopped)",
                    self.id
                ),
            });
        };
        match crate::sys::pidfd_signal(fd, signal) {
            Ok(()) => Ok(()),
            // It exited meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            Err(e) => Err(JobError::Failed {
                reason: format!("signalling job {}: {e}", self.id),
            }),
        }
    }

    /// Asks the job to end for `reason`: SIGTERM to its program (and SIGCONT, so a stopped
    /// one gets it). Returns at once, whether the program could be told; [`Job::wait`] for
    /// the end.
    fn ask_end(&self, reason: JobEndReason) -> bool {
        let mut asked = self.asked.lock();
        if asked.is_none() {
            *asked = Some(reason);
        }
        drop(asked);
        let told = self.signal(libc::SIGTERM).is_ok();
        let _ = self.signal(libc::SIGCONT);
        told
    }
}

struct Inner {
    events: Arc<dyn EventStore>,
    records: record::Records,
    jobs: Mutex<Vec<Arc<Job>>>,
    /// Slots taken by jobs being started, per session, so two racing starts respect the bound.
    starting: Mutex<Vec<String>>,
    closing: std::sync::atomic::AtomicBool,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// The background jobs of one runtime. See the module docs.
pub struct JobTable {
    inner: Arc<Inner>,
}

impl fmt::Debug for JobTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobTable")
            .field("jobs", &self.inner.jobs.lock().len())
            .finish_non_exhaustive()
    }
}

/// A job that a dead host left running, closed by [`JobTable::open`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterruptedJob {
    /// Its session.
    pub session_id: String,
    /// Its id.
    pub job_id: String,
}

/// How long a job asked to end gets before every process of it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

impl JobTable {
    /// A table recording in `events`, keeping its records under `work_root` (the sandbox
    /// root). Jobs a dead host left there are recorded `job.exited` with reason `interrupted`
    /// first, and returned.
    ///
    /// # Errors
    /// The records directory could not be made, or an interrupted job's end not recorded.
    pub fn open(
        events: Arc<dyn EventStore>,
        work_root: &Path,
    ) -> Result<(JobTable, Vec<InterruptedJob>), JobError> {
        let failed = |what: &str, e: &dyn fmt::Display| JobError::Failed {
            reason: format!("{what} under {}: {e}", work_root.display()),
        };
        let mut interrupted = Vec::new();
        for dead in record::dead(work_root).map_err(|e| failed("reading job records", &e))? {
            for r in &dead.records {
                if close_interrupted(events.as_ref(), r)
                    .map_err(|e| failed("recording an interrupted job", &e))?
                {
                    interrupted.push(InterruptedJob {
                        session_id: r.session_id.clone(),
                        job_id: r.job_id.clone(),
                    });
                }
            }
            dead.remove();
        }
        let records = record::Records::create(work_root)
            .map_err(|e| failed("creating the job records directory", &e))?;
        Ok((
            JobTable {
                inner: Arc::new(Inner {
                    events,
                    records,
                    jobs: Mutex::new(Vec::new()),
                    starting: Mutex::new(Vec::new()),
                    closing: std::sync::atomic::AtomicBool::new(false),
                    threads: Mutex::new(Vec::new()),
                }),
            },
            interrupted,
        ))
    }

    /// Takes one of `session`'s at most `max` job slots, for a job about to start.
    ///
    /// # Errors
    /// [`JobError::TooMany`] when the session's jobs (running or starting) fill them;
    /// [`JobError::Closed`] when the runtime is closing.
    pub(crate) fn reserve(&self, session: &str, max: usize) -> Result<Slot<'_>, JobError> {
        let jobs = self.inner.jobs.lock();
        if self
            .inner
            .closing
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Err(JobError::Closed);
        }
        let mut starting = self.inner.starting.lock();
        let running = jobs
            .iter()
            .filter(|j| j.session == session && j.running())
            .count();
        let pending = starting.iter().filter(|s| *s == session).count();
        if running + pending >= max {
            return Err(JobError::TooMany {
                session_id: session.to_owned(),
                max,
            });
        }
        starting.push(session.to_owned());
        Ok(Slot {
            table: self,
            session: session.to_owned(),
        })
    }

    fn find(&self, session: &str, job_id: &str) -> Result<Arc<Job>, JobError> {
        self.inner
            .jobs
            .lock()
            .iter()
            .find(|j| j.id == job_id && j.session == session)
            .cloned()
            .ok_or_else(|| JobError::Unknown {
                job_id: job_id.to_owned(),
            })
    }

    /// Up to `max` bytes of each stream of `session`'s job `job_id` after `cursor`.
    ///
    /// # Errors
    /// [`JobError::Unknown`].
    pub fn read(
        &self,
        session: &str,
        job_id: &str,
        cursor: JobCursor,
        max: usize,
    ) -> Result<JobOutput, JobError> {
        let job = self.find(session, job_id)?;
        // The status first: an ended job's output is complete before its end is set.
        let status = job.status();
        let out = job.out.lock();
        let o = out[0].read(cursor.stdout, max);
        let e = out[1].read(cursor.stderr, max);
        Ok(JobOutput {
            stdout: o.bytes,
            stderr: e.bytes,
            cursor: JobCursor {
                stdout: o.next,
                stderr: e.next,
            },
            stdout_dropped: o.dropped,
            stderr_dropped: e.dropped,
            status,
        })
    }

    /// Waits up to `timeout` for the job to end; its status then.
    ///
    /// # Errors
    /// [`JobError::Unknown`].
    pub fn wait(
        &self,
        session: &str,
        job_id: &str,
        timeout: Duration,
    ) -> Result<JobStatus, JobError> {
        Ok(self.find(session, job_id)?.wait(timeout))
    }

    /// Sends `signal` (one of [`SIGNALS`]) to the job's program; a job that has ended is left
    /// as it is.
    ///
    /// # Errors
    /// [`JobError::Unknown`], [`JobError::BadSignal`], [`JobError::Failed`].
    pub fn signal(&self, session: &str, job_id: &str, signal: i32) -> Result<(), JobError> {
        if !SIGNALS.iter().any(|(_, s)| *s == signal) {
            return Err(JobError::BadSignal {
                given: signal.to_string(),
            });
        }
        self.find(session, job_id)?.signal(signal)
    }

    /// Stops the job: SIGTERM to its program, and after `grace` every process of it killed.
    /// Returns once it has ended (recorded `stopped`, unless it had ended already).
    ///
    /// # Errors
    /// [`JobError::Unknown`].
    pub fn stop(
        &self,
        session: &str,
        job_id: &str,
        grace: Duration,
    ) -> Result<JobStatus, JobError> {
        let job = self.find(session, job_id)?;
        Ok(end_all(&[job], JobEndReason::Stopped, grace)
            .pop()
            .unwrap_or(JobStatus::Running {
                elapsed: Duration::ZERO,
            }))
    }

    /// The jobs of `session` (running, and the last ended ones), oldest first.
    pub fn list(&self, session: &str) -> Vec<JobInfo> {
        self.inner
            .jobs
            .lock()
            .iter()
            .filter(|j| j.session == session)
            .map(|j| JobInfo {
                job_id: j.id.clone(),
                session_id: j.session.clone(),
                command: j.command.clone(),
                status: j.status(),
            })
            .collect()
    }

    /// Ends `session`'s running jobs (recorded `session_ended`) and forgets its ended ones;
    /// returns once every process of them is gone.
    pub fn end_session(&self, session: &str) {
        let jobs: Vec<Arc<Job>> = self
            .inner
            .jobs
            .lock()
            .iter()
            .filter(|j| j.session == session)
            .cloned()
            .collect();
        end_all(&jobs, JobEndReason::SessionEnded, STOP_GRACE);
        // Only those that ended: a job the session started meanwhile stays reachable.
        self.inner
            .jobs
            .lock()
            .retain(|j| j.session != session || j.running());
    }

    /// Jobs running now, in every session.
    pub fn running(&self) -> usize {
        self.inner
            .jobs
            .lock()
            .iter()
            .filter(|j| j.running())
            .count()
    }
}

impl JobTable {
    /// Ends every running job (recorded `runtime_closed`), waits for their ends to be
    /// recorded, and starts no job after. The runtime calls it when dropped; dropping the
    /// table does too.
    pub fn close(&self) {
        {
            // Under the jobs lock, as `reserve` checks: no job is admitted after this.
            let _jobs = self.inner.jobs.lock();
            self.inner
                .closing
                .store(true, std::sync::atomic::Ordering::Release);
        }
        // A job whose slot was taken before the flag is pushed within its launch: wait for
        // those launches, so none is missed.
        while !self.inner.starting.lock().is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let jobs: Vec<Arc<Job>> = self.inner.jobs.lock().clone();
        end_all(&jobs, JobEndReason::RuntimeClosed, STOP_GRACE);
        let threads = std::mem::take(&mut *self.inner.threads.lock());
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for JobTable {
    fn drop(&mut self) {
        self.close();
    }
}

/// Asks every job to end, gives them `grace` together, kills what is left, and waits for each
/// end; the statuses, in order.
fn end_all(jobs: &[Arc<Job>], reason: JobEndReason, grace: Duration) -> Vec<JobStatus> {
    for j in jobs.iter().filter(|j| j.running()) {
        if !j.ask_end(reason) {
            j.cancel.cancel(); // no way to ask it: no grace to wait out
        }
    }
    let deadline = deadline_after(grace);
    for j in jobs {
        j.wait(deadline.map_or(grace, |d| d.saturating_duration_since(Instant::now())));
    }
    for j in jobs.iter().filter(|j| j.running()) {
        j.cancel.cancel();
    }
    // The supervisor kills everything at once on a cancel; the wait is for the reap and the
    // record, bounded by the supervisor's own stop grace.
    jobs.iter()
        .map(|j| j.wait(Duration::from_secs(30)))
        .collect()
}

/// Records the end of a job a dead host left, unless its session's stream already holds it
/// (or never recorded its start); whether it recorded one.
fn close_interrupted(
    events: &dyn EventStore,
    r: &record::Record,
) -> Result<bool, crate::events::EventStoreError> {
    let stream = session_stream(&r.session_id);
    let (mut started, mut ended, mut version, mut from) = (false, false, 0, 1);
    loop {
        let page = events.read_stream(&stream, from, 1000)?;
        let Some(last) = page.last().map(|e| e.stream_version) else {
            break;
        };
        for e in &page {
            version = e.stream_version;
            if e.payload["job_id"].as_str() != Some(&r.job_id) {
                continue;
            }
            // Every type is named: a new one is a compile error here until it is decided
            // whether it starts or ends a job.
            match EventType::of(&e.type_id) {
                Some(EventType::JobStarted) => started = true,
                Some(EventType::JobExited) => ended = true,
                Some(
                    EventType::ModelLoaded
                    | EventType::ModelUnloaded
                    | EventType::ModelEndpointFailover
                    | EventType::ToolApprovalDecided
                    | EventType::ToolApprovalRequested
                    | EventType::ToolExecutionStarted
                    | EventType::ToolExecutionCompleted
                    | EventType::ToolExecutionFailed
                    | EventType::ToolExecutionRejected
                    | EventType::ToolExecutionCancelled
                    | EventType::ToolExecutionInterrupted
                    | EventType::ToolProgress
                    | EventType::ToolNetworkDenied
                    | EventType::WorkspaceStaged
                    | EventType::WorkspaceSettled
                    | EventType::InferenceCompleted
                    | EventType::EmbeddingCompleted
                    | EventType::ModelCacheRestored
                    | EventType::ModelCacheMissed
                    | EventType::ModelCacheSaved
                    | EventType::SessionWaiting
                    | EventType::SessionSignaled
                    | EventType::McpServerStarted
                    | EventType::McpServerExited
                    | EventType::McpRequestRefused
                    | EventType::McpToolsPinned
                    | EventType::McpToolHeld
                    | EventType::SessionStepStarted
                    | EventType::SessionStepCompleted
                    | EventType::SessionStepFailed,
                )
                | None => {}
            }
        }
        from = last + 1;
    }
    if !started || ended {
        return Ok(false);
    }
    let event = DomainEvent::JobExited {
        session_id: r.session_id.clone(),
        job_id: r.job_id.clone(),
        reason: "interrupted".into(),
        exit_code: None,
        signal: None,
        duration_ms: None,
        stdout_bytes: 0,
        stderr_bytes: 0,
    };
    // At the version read: a recovery racing this one records it once.
    match events.append(
        &stream,
        ExpectedVersion::Exact(version),
        &[event.to_new_event()],
    ) {
        Ok(_) => Ok(true),
        Err(crate::events::EventStoreError::WrongExpectedVersion { .. }) => {
            close_interrupted(events, r)
        }
        Err(e) => Err(e),
    }
}

/// A session's job slot, taken before its program starts; given back when dropped unless a
/// job took it.
pub(crate) struct Slot<'a> {
    table: &'a JobTable,
    session: String,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut starting = self.table.inner.starting.lock();
        if let Some(i) = starting.iter().position(|s| *s == self.session) {
            starting.remove(i);
        }
    }
}

impl Slot<'_> {
    /// Makes `started` a job: records it (`job.started`), then reads its output on a thread of
    /// its own until it ends, and records the end. Returns its id.
    ///
    /// # Errors
    /// The record could not be written or the log refused `job.started`: the program is
    /// killed (and its cleanup run), nothing is left running.
    pub fn launch(self, started: Started, launch: Launch) -> Result<String, JobError> {
        let table = self.table;
        let inner = &table.inner;
        let id = format!("job-{}", crate::ids::random_uuid());
        let kill = |started: Started, cleanup: Box<dyn FnOnce() + Send>, why: String| {
            drop(started); // kills and reaps everything it started
            cleanup();
            Err(JobError::Failed { reason: why })
        };
        let recorded =
            self.record_start(&id, launch.invocation_id, &launch.command, launch.timeout);
        if let Err(why) = recorded {
            return kill(started, launch.cleanup, why);
        }
        let job = new_job(
            &id,
            &self.session,
            launch.command,
            launch.buffer_bytes,
            &started,
        );
        {
            let mut jobs = inner.jobs.lock();
            forget_oldest_ended(&mut jobs, &self.session);
            jobs.push(job.clone());
        }
        drop(self); // the job holds the slot now
        join_finished_threads(inner);
        let shared = inner.clone();
        let pumped = std::thread::Builder::new()
            .name(format!("correx-{id}"))
            .spawn({
                let job = job.clone();
                move || pump(&shared, &job, started, launch.cleanup)
            });
        match pumped {
            Ok(t) => {
                inner.threads.lock().push(t);
                Ok(id)
            }
            // The closure (and with it the program) was dropped: the job is gone.
            Err(e) => {
                finish(
                    inner,
                    &job,
                    None,
                    Some(format!("no thread for the job: {e}")),
                );
                Err(JobError::Failed {
                    reason: format!("starting the job's reader thread: {e}"),
                })
            }
        }
    }

    /// Writes the job's record, then records its start (`job.started`), removing the record
    /// again if the log refuses it; why it failed, if it did.
    fn record_start(
        &self,
        id: &str,
        invocation_id: String,
        command: &[String],
        timeout: Duration,
    ) -> Result<(), String> {
        let inner = &self.table.inner;
        let record = record::Record {
            session_id: self.session.clone(),
            job_id: id.to_owned(),
        };
        if let Err(e) = inner.records.add(&record) {
            return Err(format!("writing the job's record: {e}"));
        }
        let begun = DomainEvent::JobStarted {
            session_id: self.session.clone(),
            job_id: id.to_owned(),
            invocation_id,
            command: command.to_vec(),
            timeout_ms: timeout.as_millis() as u64,
        };
        if let Err(e) = inner.events.append(
            &session_stream(&self.session),
            ExpectedVersion::Any,
            &[begun.to_new_event()],
        ) {
            inner.records.remove(id);
            return Err(format!("recording the job's start: {e}"));
        }
        Ok(())
    }
}

/// A running job of `session`, its program `started`.
fn new_job(
    id: &str,
    session: &str,
    command: Vec<String>,
    buffer_bytes: usize,
    started: &Started,
) -> Arc<Job> {
    Arc::new(Job {
        id: id.to_owned(),
        session: session.to_owned(),
        command,
        started: Instant::now(),
        out: Mutex::new([Tail::new(buffer_bytes), Tail::new(buffer_bytes)]),
        end: Mutex::new(None),
        ended: Condvar::new(),
        asked: Mutex::new(None),
        cancel: CancelToken::new(),
        pidfd: Mutex::new(started.program_pidfd()),
    })
}

/// Threads of jobs that ended are joined as new ones start, so they never pile up.
fn join_finished_threads(inner: &Inner) {
    let mut threads = inner.threads.lock();
    let (done, live): (Vec<_>, Vec<_>) = std::mem::take(&mut *threads)
        .into_iter()
        .partition(|t| t.is_finished());
    *threads = live;
    drop(threads);
    for t in done {
        let _ = t.join();
    }
}

/// Keeps at most [`KEPT_ENDED`] ended jobs of `session`.
fn forget_oldest_ended(jobs: &mut Vec<Arc<Job>>, session: &str) {
    let ended: Vec<usize> = jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| j.session == session && !j.running())
        .map(|(i, _)| i)
        .collect();
    if ended.len() >= KEPT_ENDED {
        jobs.remove(ended[0]);
    }
    if jobs.iter().filter(|j| !j.running()).count() >= KEPT_ENDED_TOTAL {
        if let Some(i) = jobs.iter().position(|j| !j.running()) {
            jobs.remove(i);
        }
    }
}

struct JobSink<'a>(&'a Job);

impl crate::sys::spawn::Sink for JobSink<'_> {
    fn take(&mut self, stream: usize, bytes: &[u8]) {
        self.0.out.lock()[stream.min(1)].push(bytes);
    }
}

/// The job's thread: reads its output until it ends, cleans up, records the end.
fn pump(inner: &Inner, job: &Job, started: Started, cleanup: Box<dyn FnOnce() + Send>) {
    let ended = started.wait(&mut JobSink(job), Some(&job.cancel));
    cleanup();
    match ended {
        Ok(e) => finish(inner, job, Some(e), None),
        Err(err) => finish(inner, job, None, Some(err.to_string())),
    }
}

/// Records the job's end and wakes its waiters; its record goes once the end is in the log.
fn finish(
    inner: &Inner,
    job: &Job,
    ended: Option<crate::sys::spawn::Ended>,
    failure: Option<String>,
) {
    if let Some(f) = &failure {
        log::error!("job {}: {f}; every process of it was killed", job.id);
    }
    let asked = *job.asked.lock();
    let reason = match (asked, ended) {
        (Some(r), _) => r,
        (None, Some(e)) if e.timed_out => JobEndReason::TimedOut,
        _ => JobEndReason::Exited,
    };
    let (exit_code, signal) = match ended.map(|e| e.exit) {
        Some(Exit::Code(c)) => (Some(c), None),
        Some(Exit::Signal(s)) => (None, Some(s)),
        None => (None, Some(libc::SIGKILL)),
    };
    let duration = ended.map_or_else(|| job.started.elapsed(), |e| e.duration);
    let (stdout_bytes, stderr_bytes) = {
        let out = job.out.lock();
        (out[0].written(), out[1].written())
    };
    let event = DomainEvent::JobExited {
        session_id: job.session.clone(),
        job_id: job.id.clone(),
        reason: reason.as_str().into(),
        exit_code,
        signal,
        duration_ms: Some(duration.as_millis() as u64),
        stdout_bytes,
        stderr_bytes,
    };
    match inner.events.append(
        &session_stream(&job.session),
        ExpectedVersion::Any,
        &[event.to_new_event()],
    ) {
        Ok(_) => inner.records.remove(&job.id),
        // The record stays: the next runtime records this job interrupted.
        Err(e) => log::error!("recording the end of job {}: {e}", job.id),
    }
    drop(job.pidfd.lock().take());
    *job.end.lock() = Some(JobStatus::Ended {
        reason,
        exit_code,
        signal,
        duration,
    });
    job.ended.notify_all();
}

impl Background for JobTable {
    fn reserve(&self, session: &str, max: usize) -> Result<Box<dyn Reserved + '_>, String> {
        JobTable::reserve(self, session, max)
            .map(|slot| Box::new(slot) as Box<dyn Reserved + '_>)
            .map_err(|e| e.to_string())
    }
}

impl Reserved for Slot<'_> {
    fn launch(self: Box<Self>, started: Started, launch: Launch) -> Result<String, String> {
        Slot::launch(*self, started, launch).map_err(|e| e.to_string())
    }
}
