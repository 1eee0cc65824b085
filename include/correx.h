#ifndef CORREX_H
#define CORREX_H

#include <stdint.h>
#include <stddef.h>

/*
 * correx: the infrastructure layer of a local-first LLM agent runtime.
 *
 * Conventions:
 * - Every call returns an int32_t status: CORREX_OK (0) or a CORREX_E_* code. Each takes an
 *   optional `correx_error **err` that receives an error (code and message) on failure; free it
 *   with correx_error_free. There is no thread-local "last error".
 * - Handles are opaque. Constructors write their out-param only on success. Every *_free(NULL)
 *   is a no-op; freeing twice is undefined behaviour.
 * - Strings in are NUL-terminated UTF-8 (invalid UTF-8 is CORREX_E_INVALID_ARGUMENT). Strings
 *   out belong to the caller and are freed only with correx_string_free.
 * - Complex payloads are JSON objects carrying "v": 1.
 * - A panic inside correx returns CORREX_E_PANIC and leaves that handle unusable
 *   (CORREX_E_UNUSABLE); it can still be freed.
 * - A runtime may be shared by any number of threads.
 */

/**
 * The longest identity a decision may carry, in bytes.
 */
#define MAX_IDENTITY 256

/**
 * Success.
 */
#define CORREX_OK 0

/**
 * A required pointer argument was NULL.
 */
#define CORREX_E_NULL 1

/**
 * An argument is malformed: invalid UTF-8, JSON that does not parse or has the wrong shape,
 * a `"v"` other than 1, an out-of-range integer.
 */
#define CORREX_E_INVALID_ARGUMENT 2

/**
 * The runtime config is invalid (the message names the field).
 */
#define CORREX_E_CONFIG 3

/**
 * The event log failed (I/O, corruption, locked too long).
 */
#define CORREX_E_EVENT_STORE 4

/**
 * An append's expected version did not hold (re-read the stream and retry), or a session
 * step key was recorded for another request (use a new key).
 */
#define CORREX_E_CONFLICT 5

/**
 * A model could not be loaded or unloaded.
 */
#define CORREX_E_MODEL 6

/**
 * An inference failed (connection, timeout, HTTP, context size, malformed body).
 */
#define CORREX_E_INFERENCE 7

/**
 * The call was cancelled through its `correx_cancel`.
 */
#define CORREX_E_CANCELLED 8

/**
 * A panic inside correx was caught; the handle is now unusable.
 */
#define CORREX_E_PANIC 9

/**
 * The handle was marked unusable by an earlier caught panic; free it and make a new one.
 */
#define CORREX_E_UNUSABLE 10

/**
 * The named model was never loaded through this runtime.
 */
#define CORREX_E_UNKNOWN_MODEL 11

/**
 * A file or tool could not be set up (a missing allowed path or executable).
 */
#define CORREX_E_TOOL_SETUP 12

/**
 * A model could not be replaced or unloaded because inferences were still running on it
 * after the drain timeout; nothing was changed.
 */
#define CORREX_E_BUSY 13

/**
 * A session step's run waits for a durable approval decision: nothing ran. Decide the
 * request (`correx_approvals_decide`, from any process), then call the step again.
 */
#define CORREX_E_PENDING 14

/**
 * The named record does not exist (an approval request the session never made).
 */
#define CORREX_E_NOT_FOUND 15

/**
 * An approval callback's answer that approves. Any value but this,
 * `CORREX_APPROVE_FOR_SESSION` and `CORREX_DEFER` denies.
 */
#define CORREX_APPROVE 1

/**
 * An approval callback's answer that approves this request and, for the rest of its session,
 * every request of the same tool whose argv starts with this one's (every request of a tool
 * without an argv): they are not asked about again.
 */
#define CORREX_APPROVE_FOR_SESSION 2

/**
 * An approval callback's answer that denies.
 */
#define CORREX_DENY 0

/**
 * An approval callback's answer that defers the request to a durable decision: it is
 * recorded (`tool.approval_requested`) and waits for `correx_approvals_decide` from any
 * process; the run does not start now (a session step returns `CORREX_E_PENDING`). Asked
 * again for the same run, the recorded decision answers before the callback is called.
 */
#define CORREX_DEFER 3

/**
 * `correx_infer_stream`'s chunk callback: the piece is answer text.
 */
#define CORREX_CHUNK_TEXT 0

/**
 * `correx_infer_stream`'s chunk callback: the piece is the model's reasoning.
 */
#define CORREX_CHUNK_REASONING 1

/**
 * A chunk callback's answer that lets the generation go on. Any other value stops it.
 */
#define CORREX_CONTINUE 0

/**
 * `correx_events_append`: append whatever the stream holds.
 */
#define CORREX_EXPECT_ANY 0

/**
 * `correx_events_append`: the stream must not exist yet.
 */
#define CORREX_EXPECT_NO_STREAM 1

/**
 * `correx_events_append`: the stream's last version must equal `expected_version`.
 */
#define CORREX_EXPECT_EXACT 2

/**
 * The ABI's major version: bumped on incompatible changes.
 */
#define CORREX_ABI_VERSION_MAJOR 0

/**
 * The ABI's minor version: bumped when calls are added.
 */
#define CORREX_ABI_VERSION_MINOR 4

/**
 * The ABI's patch version: bumped for fixes that change no signature.
 */
#define CORREX_ABI_VERSION_PATCH 0

/**
 * The ABI version as one number: `MAJOR << 16 | MINOR << 8 | PATCH`; compare it with
 * `correx_abi_version()` at run time.
 */
#define CORREX_ABI_VERSION (((CORREX_ABI_VERSION_MAJOR << 16) | (CORREX_ABI_VERSION_MINOR << 8)) | CORREX_ABI_VERSION_PATCH)

/**
 * `correx_runtime_set_mcp_handler`'s `methods` bit: it answers `sampling/createMessage`.
 */
#define CORREX_MCP_SAMPLING 1

/**
 * `correx_runtime_set_mcp_handler`'s `methods` bit: it answers `elicitation/create`.
 */
#define CORREX_MCP_ELICITATION 2

/**
 * Its size in bytes.
 */
#define LlamaInstall_MODEL_BYTES 253113024

/**
 * The longest step key, in bytes.
 */
#define MAX_STEP_KEY 256

/**
 * The largest signal payload, in bytes of JSON.
 */
#define MAX_SIGNAL_BYTES (1 << 20)

/**
 * What one endpoint offers, as probed when its model was loaded (`model.loaded` records it
 * per endpoint). A request that needs what its endpoint lacks goes to one that has it, or
 * fails with [`crate::InferenceError::Unsupported`] before anything is sent.
 */
typedef struct EndpointFeatures EndpointFeatures;

/**
 * A cancellation flag for blocking calls (`correx_model_load`, `correx_infer`,
 * `correx_infer_stream`, `correx_tool_execute_with_cancel`). Trigger it from any thread.
 */
typedef struct correx_cancel correx_cancel;

/**
 * An error: a `CORREX_E_*` code and a message saying what failed and what to try.
 */
typedef struct correx_error correx_error;

/**
 * The answer to one request of an MCP server, filled in by the host's handler during its
 * call (`correx_mcp_answer_set` or `correx_mcp_answer_refuse`). Owned by correx; valid only
 * until the handler returns.
 */
typedef struct correx_mcp_answer correx_mcp_answer;

/**
 * A correx runtime: the event log, the model manager and the sandboxed tools. Share one
 * handle among threads freely; free it once, after every other call on it returned.
 */
typedef struct correx_runtime correx_runtime;

/**
 * A subscription to the event log: every event with a position greater than the one it was
 * created with, in position order, exactly once, appended by any thread or process. Use it
 * from one thread at a time; free it with `correx_subscription_free`.
 */
typedef struct correx_subscription correx_subscription;

/**
 * A log callback: `level` is 1 (error) to 5 (trace); `message` lives only during the call.
 * It may be called from any thread, including correx's own background threads.
 */
typedef void (*correx_log_callback)(void *user_data, int32_t level, const char *message);

/**
 * A handler of MCP servers' requests to the host (see `correx_runtime_set_mcp_handler`).
 *
 * `server` is the server's name in the config, `method` `"sampling/createMessage"` or
 * `"elicitation/create"`, `params_json` the request's `params` object as the server sent it;
 * all three live only during the call. Fill `answer` with `correx_mcp_answer_set` (the result
 * object: a `CreateMessageResult` for sampling, an `ElicitResult` for elicitation) and return
 * `CORREX_OK`; return anything else to decline (JSON-RPC error -1 with the message given to
 * `correx_mcp_answer_refuse`, else "declined by the host"); `CORREX_OK` without a result is
 * error -32603. It runs on a thread of correx's, with no correx lock held: it may block (to
 * ask a person, or to run a model, also through this runtime, but never free the runtime)
 * and should return soon after `correx_mcp_answer_cancelled` turns 1.
 */
typedef int32_t (*correx_mcp_handler_fn)(void *user_data,
                                         const char *server,
                                         const char *method,
                                         const char *params_json,
                                         struct correx_mcp_answer *answer);

/**
 * Frees the `user_data` given with a callback, when correx no longer needs it.
 */
typedef void (*correx_free_fn)(void *user_data);

/**
 * Receives each piece of a streamed answer.
 *
 * `kind` is `CORREX_CHUNK_TEXT` or `CORREX_CHUNK_REASONING`; `text` is `len` bytes of UTF-8
 * (a token or a few), NUL-terminated, living only during the call. Return `CORREX_CONTINUE`
 * to go on; any other value stops the generation (the call then returns
 * `CORREX_E_CANCELLED`). It runs on the thread that called `correx_infer_stream`, before that
 * call returns, with no correx lock held: it may call correx (`correx_cancel_trigger`, events,
 * other models) but must not free the runtime, and must not unwind (throw or `longjmp`) out.
 */
typedef int32_t (*correx_chunk_fn)(void *user_data, int32_t kind, const char *text, size_t len);

/**
 * An approval callback: asked for every T2 and T3 tool before it runs.
 *
 * `tool` is the tool's name, `tier` 0..3, `request_json` the full request with its context
 * (`{"v":1,"invocation_id":..,"session_id":..,"tool_name":..,"parameters":{..},"context":
 * {"session_id":..,"stage_id":..|null,"mode":"interactive"|"auto"|"deny","invocation_id":..,
 * "tier":2,"paths":["/abs/path",..],"argv":[..]|null,"notice":"..."|null}}`, `paths` being
 * every file the tool may change, `argv` the shell's command line, and `notice` why a person
 * must decide it whatever the rules or earlier answers (an MCP tool whose definition changed
 * since it was pinned, under `on_tool_change: "ask"`); both strings live only during the call.
 * Return `CORREX_APPROVE` to approve, `CORREX_APPROVE_FOR_SESSION` to approve it and the same
 * tool and argv prefix for the rest of the session, `CORREX_DEFER` to record the request for
 * a durable decision from any process (`correx_approvals_decide`; a session step returns
 * `CORREX_E_PENDING`, and a run asked about again is answered from its recorded decision
 * without calling back); any other value denies. Rules in the
 * config's `approvals.rules` are checked first: a request they allow or forbid never reaches
 * the callback. It runs
 * on the thread that called `correx_tool_execute`, with no correx lock held, so it may block
 * (to ask a person) and may call correx (but not free the runtime).
 */
typedef int32_t (*correx_approve_fn)(void *user_data,
                                     const char *tool,
                                     int32_t tier,
                                     const char *request_json);





#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * The ABI version of the loaded library, `MAJOR << 16 | MINOR << 8 | PATCH`.
 *
 * # Returns
 * The version; compare it with the header's `CORREX_ABI_VERSION`.
 *
 * # Blocking and threads
 * Never blocks; callable from any thread.
 */
int32_t correx_abi_version(void);

/**
 * The error's `CORREX_E_*` code.
 *
 * # Parameters
 * - `error`: an error from any correx call, or NULL (then `CORREX_E_NULL` is returned).
 *
 * # Safety
 * `error` is NULL or a live error from correx.
 */
int32_t correx_error_code(const struct correx_error *error);

/**
 * The error's message: what failed and what to try.
 *
 * # Parameters
 * - `error`: an error from any correx call, or NULL (then an empty string is returned).
 *
 * # Memory and lifetimes
 * The string belongs to the error and lives until `correx_error_free(error)`; do not free it.
 *
 * # Safety
 * `error` is NULL or a live error from correx.
 */
const char *correx_error_message(const struct correx_error *error);

/**
 * Frees an error. NULL is a no-op; freeing the same error twice is undefined behaviour.
 *
 * # Safety
 * `error` is NULL or an error from correx not yet freed.
 */
void correx_error_free(struct correx_error *error);

/**
 * Frees a string correx returned. NULL is a no-op; freeing twice is undefined behaviour.
 *
 * # Safety
 * `s` is NULL or a string returned by correx not yet freed.
 */
void correx_string_free(char *s);

/**
 * Decides durable approval request `request_id` of session `session_id` (a run whose
 * approver deferred: the `CORREX_E_PENDING` of `correx_session_execute` names it). The first
 * decision wins; the step that asked runs once, when it is called again after an approval.
 *
 * # Parameters
 * - `session_id`, `request_id`: 1 to 256 bytes of UTF-8 without control characters.
 * - `decision_json`: `{"v": 1, "decision": "approve"|"approve_for_session"|"deny",
 *   "identity": "who decides, 1 to 256 bytes", "reason": "a denial's reason (optional)"}`.
 * - `out_json`: receives the recorded decision: `{"decision", "decided_by": "api",
 *   "identity", "reason", "at_ms", "position"}`.
 *
 * # Returns
 * `CORREX_OK`; `CORREX_E_CONFLICT` when the request was decided already (the message names
 * the first decision, which stands) or its deadline passed (it is now recorded expired);
 * `CORREX_E_NOT_FOUND` when the session has no such request; `CORREX_E_INVALID_ARGUMENT`,
 * `CORREX_E_EVENT_STORE`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Reads the session's stream and appends one event. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_approvals_decide(const struct correx_runtime *rt,
                                const char *session_id,
                                const char *request_id,
                                const char *decision_json,
                                char **out_json,
                                struct correx_error **err);

/**
 * The durable approval requests: those of session `session_id`, decided or not, or (with a
 * NULL `session_id`) every request of the log that waits (`all` nonzero: decided ones too).
 * A request found past its deadline is recorded expired first.
 *
 * # Parameters
 * - `out_json`: receives `{"v": 1, "requests": [{"session_id", "request_id", "tool_name",
 *   "tier", "parameters", "argv", "paths", "asked_by", "requested_at_ms", "deadline_ms",
 *   "position", "decision": null | {"decision", "decided_by", "identity", "reason", "at_ms",
 *   "position"}}]}`, oldest first.
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_EVENT_STORE`, `CORREX_E_NULL`,
 * `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * With a session: reads what its stream appended since the last call. Without: reads the
 * whole log. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_approvals_list(const struct correx_runtime *rt,
                              const char *session_id,
                              int32_t all,
                              char **out_json,
                              struct correx_error **err);

/**
 * Creates a cancellation flag.
 *
 * # Returns
 * `CORREX_OK` or `CORREX_E_NULL`. On success `*out` owns a flag freed with
 * `correx_cancel_free`; on error it is untouched.
 *
 * # Safety
 * `out` and `err` are NULL or valid for a write.
 */
int32_t correx_cancel_new(struct correx_cancel **out, struct correx_error **err);

/**
 * Asks every call using this flag to stop; they return `CORREX_E_CANCELLED` soon after.
 * NULL is a no-op.
 *
 * # Blocking and threads
 * Never blocks; safe from any thread, also while another thread is blocked using the flag.
 *
 * # Safety
 * `cancel` is NULL or live.
 */
void correx_cancel_trigger(const struct correx_cancel *cancel);

/**
 * Clears the flag so it can be reused. NULL is a no-op.
 *
 * # Safety
 * `cancel` is NULL or live.
 */
void correx_cancel_reset(const struct correx_cancel *cancel);

/**
 * Frees a cancellation flag. NULL is a no-op; freeing twice is undefined behaviour. Free it
 * only after the calls using it returned.
 *
 * # Safety
 * `cancel` is NULL or a flag from `correx_cancel_new` not yet freed.
 */
void correx_cancel_free(struct correx_cancel *cancel);

/**
 * Appends events to a stream atomically.
 *
 * # Parameters
 * - `stream`: the stream's name (not empty).
 * - `expected_kind`: `CORREX_EXPECT_ANY`, `CORREX_EXPECT_NO_STREAM` or `CORREX_EXPECT_EXACT`.
 * - `expected_version`: the version `CORREX_EXPECT_EXACT` expects; ignored otherwise.
 * - `events_json`: `{"v": 1, "events": [{"type_id": "note.added", "schema_version": 1,
 *   "payload": {...}, "event_id": "optional", "correlation_id": null, "causation_id": null}]}`.
 *   `type_id` is required and not empty; the others are optional (`schema_version` 1, `payload`
 *   null, a fresh `event_id`); unknown fields are refused. An `event_id` appended before is
 *   stored once (the retry returns the first positions).
 * - `out_json`: optional; receives `{"v": 1, "first_position", "last_position",
 *   "stream_version"}`.
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_CONFLICT` (expected
 * version), `CORREX_E_EVENT_STORE`, `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` (when given) is the caller's, freed with `correx_string_free`.
 *
 * # Blocking and threads
 * Blocks until the events are on disk (one flush, shared with concurrent appends). Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_events_append(const struct correx_runtime *rt,
                             const char *stream,
                             int32_t expected_kind,
                             uint64_t expected_version,
                             const char *events_json,
                             char **out_json,
                             struct correx_error **err);

/**
 * Reads up to `max` events of `stream` from version `from_version` (inclusive; versions start
 * at 1): `{"v": 1, "events": [{"position", "event_id", "stream_id", "stream_version",
 * "type_id", "schema_version", "timestamp_ms", "timestamp", "correlation_id", "causation_id",
 * "payload", "summary"}]}`, where `timestamp` is RFC 3339 UTC and `summary` one line for people. At most 1000 events per call; page by asking again from the last version + 1.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Blocks for one short read. Any thread, concurrently with appends.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_events_read_stream(const struct correx_runtime *rt,
                                  const char *stream,
                                  uint64_t from_version,
                                  uint32_t max,
                                  char **out_json,
                                  struct correx_error **err);

/**
 * Reads up to `max` events of the whole log from global position `from_position` (inclusive;
 * positions start at 1), in position order, in the shape of `correx_events_read_stream`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Blocks for one short read. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_events_read_all(const struct correx_runtime *rt,
                               uint64_t from_position,
                               uint32_t max,
                               char **out_json,
                               struct correx_error **err);

/**
 * The last global position in the log (0 when empty).
 *
 * # Blocking and threads
 * Blocks for one short read. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_events_last_position(const struct correx_runtime *rt,
                                    uint64_t *out_position,
                                    struct correx_error **err);

/**
 * One request on a session's background jobs (those a `shell` request with
 * `"background": true` started), as the `jobs` tool takes it but from the host: no approval,
 * nothing recorded but the jobs' own `job.started` / `job.exited`.
 *
 * # Parameters
 * - `request_json`: `{"v": 1, "session_id": "s1", "operation": "list"|"read"|"wait"|"signal"|
 *   "stop", "job_id": "job-…", "stdout_cursor", "stderr_cursor", "max_bytes" (read),
 *   "timeout_ms" (wait, at most 60000), "signal": "TERM"|"INT"|"KILL"|"HUP"|"QUIT"|"USR1"|
 *   "USR2"|"STOP"|"CONT" (signal)}`.
 * - `cancel`: NULL, or a token that ends a `wait` early (not the job).
 * - `out_json`: receives `{"v": 1, "jobs": [{"job_id", "command", "state", ...}]}` (list);
 *   `{"v": 1, "stdout", "stderr", "stdout_cursor", "stderr_cursor", "stdout_dropped",
 *   "stderr_dropped", "status"}` (read: output since the cursors, as lossy UTF-8, with the
 *   cursors to pass next and the bytes the job's buffer no longer held); `{"v": 1, "status"}`
 *   (wait, stop); `{"v": 1, "sent"}` (signal). A status is `{"state": "running",
 *   "elapsed_ms"}` or `{"state": "ended", "reason": "exited"|"stopped"|"timed_out"|
 *   "session_ended"|"runtime_closed", "exit_code", "signal", "duration_ms"}`.
 *
 * # Returns
 * `CORREX_OK`; `CORREX_E_INVALID_ARGUMENT` for a malformed request, an unknown operation, a
 * job id this session does not have, or a signal not listed; `CORREX_E_TOOL_SETUP` when a
 * system call failed; `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * `wait` blocks up to its `timeout_ms`; `stop` up to about 2 s (SIGTERM, then every process
 * of the job killed). The rest never block. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented; `cancel` is NULL or live for the whole call.
 */
int32_t correx_jobs(const struct correx_runtime *rt,
                    const char *request_json,
                    const struct correx_cancel *cancel,
                    char **out_json,
                    struct correx_error **err);

/**
 * Ends a session's background jobs: each gets SIGTERM, then after about 2 s every process of
 * it is killed, and its end is recorded (`job.exited`, reason `session_ended`). Returns once
 * they are all gone. A session with no jobs is a no-op. The runtime also lets go of what it
 * kept of the session's steps in memory (the log keeps them all: a later
 * `correx_session_infer` reads them again).
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT` (not UTF-8, or an id no session
 * call takes: empty, over 256 bytes, or holding a control character), `CORREX_E_UNUSABLE`.
 *
 * # Blocking and threads
 * Blocks up to about 2 s while jobs end. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_session_end(const struct correx_runtime *rt,
                           const char *session_id,
                           struct correx_error **err);

/**
 * Sets (or, with a NULL callback, clears) the process-wide log callback. Records at or below
 * `max_level` (1 error, 2 warn, 3 info, 4 debug, 5 trace) are passed to it.
 *
 * # Parameters
 * - `callback`: called with `user_data`, the level and a message that lives only during the
 *   call; may be called from any thread, concurrently.
 * - `user_data`: passed back untouched; correx never frees it.
 * - `max_level`: the most verbose level delivered; out-of-range values are clamped.
 *
 * # Returns
 * `CORREX_OK`, or `CORREX_E_INVALID_ARGUMENT` when another logger (from a Rust host) owns the
 * `log` facade.
 *
 * # Blocking and threads
 * Never blocks for long; callable from any thread. The callback may run while correx holds
 * internal locks: it must return promptly and must not call any correx function.
 *
 * # Safety
 * `callback` is NULL or a function safe to call from any thread with `user_data`.
 */
int32_t correx_set_log_callback(correx_log_callback callback, void *user_data, int32_t max_level);

/**
 * Registers the handler of requests MCP servers send their client (replacing, and
 * releasing, any earlier one). A server is told at its start which of them this client
 * answers, so one already running is restarted before its next use when that changed (once
 * no call of it is in progress; recorded as a stop and a start): register the handler right
 * after `correx_runtime_new`. Without one (the state of a new runtime, or after a NULL
 * `callback`) servers are told none is answered and any such request is refused.
 *
 * # Parameters
 * - `methods`: `CORREX_MCP_SAMPLING | CORREX_MCP_ELICITATION`, the methods it answers (0 with
 *   a callback is an invalid argument).
 * - `callback`: see `correx_mcp_handler_fn`.
 * - `user_data`: passed back to `callback`.
 * - `free_user_data`: optional; called once with `user_data` when the handler is replaced or
 *   the runtime freed, after every call of it returned. When this call fails it is not
 *   called: the caller still owns `user_data`.
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_UNUSABLE`.
 *
 * # Blocking and threads
 * Never blocks for long. Any thread; the callback and user_data must be usable from any
 * thread. `correx_runtime_free` waits for handlers in progress to return (they see
 * `correx_mcp_answer_cancelled` turn 1).
 *
 * # Safety
 * `rt` is NULL or live; the callback is safe to call with `user_data` from any thread.
 */
int32_t correx_runtime_set_mcp_handler(const struct correx_runtime *rt,
                                       int32_t methods,
                                       correx_mcp_handler_fn callback,
                                       void *user_data,
                                       correx_free_fn free_user_data,
                                       struct correx_error **err);

/**
 * Sets the result a handler answers with (copied): a JSON object, sent to the server as the
 * request's `result` when the handler returns `CORREX_OK`.
 *
 * # Returns
 * `CORREX_OK`; `CORREX_E_NULL`; `CORREX_E_INVALID_ARGUMENT` when `result_json` is not UTF-8
 * or not a JSON object (nothing is set then).
 *
 * # Blocking and threads
 * Never blocks. Call it only from within the handler's call, on its thread.
 *
 * # Safety
 * `answer` is NULL or the answer of a handler call in progress; `result_json` is NULL or
 * NUL-terminated; `err` is NULL or valid for a write.
 */
int32_t correx_mcp_answer_set(struct correx_mcp_answer *answer,
                              const char *result_json,
                              struct correx_error **err);

/**
 * Refuses the request, telling the server `message` (copied; at most 4 KiB is kept). The
 * handler then returns anything but `CORREX_OK`; a result set earlier is dropped.
 *
 * # Returns
 * `CORREX_OK`; `CORREX_E_NULL`; `CORREX_E_INVALID_ARGUMENT` (not UTF-8).
 *
 * # Blocking and threads
 * Never blocks. Call it only from within the handler's call, on its thread.
 *
 * # Safety
 * `answer` is NULL or the answer of a handler call in progress; `message` is NULL or
 * NUL-terminated; `err` is NULL or valid for a write.
 */
int32_t correx_mcp_answer_refuse(struct correx_mcp_answer *answer,
                                 const char *message,
                                 struct correx_error **err);

/**
 * Whether the request was withdrawn: the server cancelled it or is stopping, or the runtime
 * is being freed. No answer is wanted any more; return soon.
 *
 * # Returns
 * 1 when withdrawn, 0 while still wanted, 0 for NULL.
 *
 * # Blocking and threads
 * Never blocks; callable from any thread during the handler's call.
 *
 * # Safety
 * `answer` is NULL or the answer of a handler call in progress.
 */
int32_t correx_mcp_answer_cancelled(const struct correx_mcp_answer *answer);

/**
 * Pins what is held of MCP server `server`: each tool whose definition changed since it was
 * pinned (recorded `mcp.tool_held`) and that no later pin covers, or only those of `tools`.
 * Each is recorded pinned by the `host` (`mcp.tools_pinned`) and used from its next call, by
 * this runtime and any other on the log.
 *
 * # Parameters
 * - `request_json`: `{"v": 1, "server": "a server of the config's mcp_servers", "tools":
 *   ["a tool's name without its server's prefix", ...] (optional; none: every held tool)}`.
 * - `out_json`: receives `{"v": 1, "pinned": {"tool": "sha256:digest", ...}}`, empty when
 *   nothing was held.
 *
 * # Returns
 * `CORREX_OK`; `CORREX_E_NOT_FOUND` when the config has no such server;
 * `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_EVENT_STORE`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Reads the log's `mcp-pins` stream and appends at most one event; starts no server. Any
 * thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_mcp_pin(const struct correx_runtime *rt,
                       const char *request_json,
                       char **out_json,
                       struct correx_error **err);

/**
 * The runtime's metrics as Prometheus text exposition (format 0.0.4, the body a `/metrics`
 * endpoint serves): what the log records (`correx_tool_runs_total{tool,outcome}`, approval
 * waits, inference latency and tokens, model loads and unloads by reason, jobs, session
 * steps) and what the runtime knows live (models resident and in flight, append latency).
 * docs/observability.md lists every family.
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_EVENT_STORE`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_text` is the caller's, a NUL-terminated UTF-8 string freed with
 * `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Reads the log: the first call reads all of it, later ones what was appended since (calls
 * take turns). Any thread.
 *
 * # Safety
 * `rt` is NULL or a live runtime; `out_text` is NULL or valid for one pointer write; `err` is
 * NULL or valid.
 */
int32_t correx_metrics(const struct correx_runtime *rt, char **out_text, struct correx_error **err);

/**
 * Loads a model (a no-op when it is loaded with the same server settings) on its own server
 * and port, evicting the least recently used idle model when `models.max_loaded` or
 * `models.memory_budget_mb` requires it; appends `model.loaded`.
 *
 * # Parameters
 * - `descriptor_json`: `{"v": 1, "model_id": "gemma", "model_path": "/m.gguf",
 *   "residency": "persistent"|"dynamic"|"ephemeral", "idle_timeout_ms": 60000,
 *   "context_size": 8192, "extra_args": ["--no-jinja", "--chat-template", "gemma"],
 *   "threads": 2, "serves": "chat"|"embeddings"}`, or for servers already running elsewhere `{"v": 1, "model_id": "far",
 *   "residency": "persistent", "endpoints": ["http://10.0.0.5:8080", ...],
 *   "endpoint_kind": "llama-server"|"openai", "api_key_env": "VAR", "served_model": "name"}`
 *   (nothing is spawned or killed; requests fail over between them; an `openai` endpoint is
 *   any engine with OpenAI's chat completions and model list, and a request needing what only
 *   llama-server has is `CORREX_E_INVALID_ARGUMENT`; the key is read from the environment
 *   variable `api_key_env` names and never recorded). `model_id` and `residency` are
 *   required; `model_path` defaults to the model `scripts/install-llama.sh` installed;
 *   unknown fields are refused.
 * - `cancel`: optional; triggering it stops the load (`CORREX_E_CANCELLED`, server killed).
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_MODEL` (the message
 * carries the server's last log lines; also a model alone over the memory budget, or remote
 * endpoints none of which answers), `CORREX_E_BUSY` (no model could be evicted: every one
 * still had inferences running after `models.drain_timeout_ms`, or servers still loading or
 * stopping held the room, or `models.max_queued` loads already waited; the message names the
 * model asked for and what it waited for; nothing changed), `CORREX_E_CANCELLED`, `CORREX_E_UNUSABLE`.
 *
 * # Blocking and threads
 * When the bounds are full, first waits for a model to have nothing in flight (running
 * inferences are never killed; at most the drain timeout, default 120 s). Then blocks until
 * the server is healthy (about a second for a small model; the health deadline defaults to
 * 30 s). Any thread; loads of different models run at once, a load of a model being loaded
 * waits for that load.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_model_load(const struct correx_runtime *rt,
                          const char *descriptor_json,
                          const struct correx_cancel *cancel,
                          struct correx_error **err);

/**
 * Unloads a model if it is loaded; appends `model.unloaded`.
 *
 * # Returns
 * `CORREX_OK` (also when it was not loaded), `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`,
 * `CORREX_E_MODEL`, `CORREX_E_BUSY` (inferences still running after the drain timeout;
 * nothing changed), `CORREX_E_UNUSABLE`.
 *
 * # Blocking and threads
 * Waits for the model's running inferences to finish (never kills them; at most
 * `models.drain_timeout_ms`, default 120 s), then until the server has exited (at most
 * `models.stop_grace_ms` after SIGTERM, default 1.5 s, then SIGKILL). Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_model_unload(const struct correx_runtime *rt,
                            const char *model_id,
                            struct correx_error **err);

/**
 * The most recently used loaded model: `{"v": 1, "model": null}` or `{"v": 1, "model":
 * {descriptor}}`; `correx_models_status` lists them all.
 *
 * # Memory and lifetimes
 * `*out_json` receives a string the caller frees with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Waits while a load is in progress. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_model_current(const struct correx_runtime *rt,
                             char **out_json,
                             struct correx_error **err);

/**
 * Whether every loaded model's server answers: `{"v": 1, "healthy": true}` or
 * `{"v": 1, "healthy": false, "reason": "model_id: ..."}` naming the first that does not.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Blocks for one HTTP call per loaded model (each at most the health timeout, 2 s); an
 * `openai` endpoint answering for the first time (or whose failed probe is due again) is also
 * probed: up to four short requests of at most 30 s each. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_model_health(const struct correx_runtime *rt,
                            char **out_json,
                            struct correx_error **err);

/**
 * Runs one inference on a model loaded earlier through this runtime (reloading it first if
 * its residency unloaded it); appends `inference.completed`.
 *
 * # Parameters
 * - `model_id`: a model passed to `correx_model_load` before.
 * - `request_json`: `{"v": 1, "context": {"system": "...", "task": "...", "entries":
 *   [{"source": "model"|"user"|"tool", "content": "...", "tool_calls": [...], "tool_call_id":
 *   "..."}]}, "config": {...}, "session": "..."}`. `context` is required (`{}` is an empty
 *   pack: one empty user message); `session` (optional) keeps a conversation's requests to a
 *   remote model on one endpoint, where its prompt is cached; in `context`, an entry needs `source` and `content`. Unknown fields are refused, at
 *   every level. Every `config` field is optional: `temperature` (0.7), `top_p`
 *   (0.95), `max_tokens` (512), `stop` ([]), `seed`, `top_k`, `min_p`, `typical_p`,
 *   `repeat_penalty`, `repeat_last_n`, `presence_penalty`, `frequency_penalty`, `mirostat`,
 *   `mirostat_tau`, `mirostat_eta` (unset: the server's default), `response_format`
 *   (`{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {"schema": {...}}}`),
 *   `grammar` (GBNF), `tools` (`[{"name", "description", "parameters": {JSON schema}}]`, for a
 *   server started with `--jinja`), `tool_choice` (`"auto"`, `"none"`, `"required"` or
 *   `{"function": "name"}`).
 * - `cancel`: optional; triggering it closes the connection: the call returns
 *   `CORREX_E_CANCELLED` at once and the server stops generating.
 * - `out_json`: receives `{"v": 1, "text": "...", "usage": {"prompt_tokens",
 *   "completion_tokens", "total_tokens"}, "finish_reason": "stop"|"length"|"tool_calls"|...,
 *   "latency_ms": 120, "model": "gemma", "tool_calls": [{"id", "name", "arguments": {...}}],
 *   "timings": {llama-server's timings} or null, "reasoning": "..." (only when the model
 *   reasoned), "endpoint": "http://..." (only for a remote model)}`.
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_UNKNOWN_MODEL`,
 * `CORREX_E_INFERENCE` (the message says which: unreachable, timed out, an HTTP error, a stream
 * that broke off or ended without its final event, a malformed event), `CORREX_E_CANCELLED`,
 * `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Blocks for the whole generation (and a reload if needed). Any thread; inferences may run
 * concurrently.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_infer(const struct correx_runtime *rt,
                     const char *model_id,
                     const char *request_json,
                     const struct correx_cancel *cancel,
                     char **out_json,
                     struct correx_error **err);

/**
 * As `correx_infer`, handing each piece of the answer to `on_chunk` as it arrives.
 *
 * # Parameters
 * As `correx_infer`, plus:
 * - `on_chunk`: called for each piece (see `correx_chunk_fn`); NULL streams without a
 *   callback (as `correx_infer`).
 * - `user_data`: passed to `on_chunk` untouched; correx never frees it.
 *
 * # Returns
 * As `correx_infer`; `CORREX_E_CANCELLED` also when `on_chunk` asked to stop.
 *
 * # Memory and lifetimes
 * `*out_json` (the whole answer, as `correx_infer`'s) is the caller's, freed with
 * `correx_string_free`; untouched on error. A chunk's text lives only during its callback.
 *
 * # Blocking and threads
 * Blocks for the whole generation; `on_chunk` runs on the calling thread. Any thread;
 * inferences may run concurrently.
 *
 * # Safety
 * Pointers are NULL or valid as documented; `on_chunk` is safe to call with `user_data` on
 * this thread.
 */
int32_t correx_infer_stream(const struct correx_runtime *rt,
                            const char *model_id,
                            const char *request_json,
                            const struct correx_cancel *cancel,
                            correx_chunk_fn on_chunk,
                            void *user_data,
                            char **out_json,
                            struct correx_error **err);

/**
 * Embeds texts on a model whose descriptor says `"serves": "embeddings"` (its server runs
 * with `--embeddings`), loading it first if needed like any resident (it counts against
 * `models.max_loaded` and the memory budget); appends `embedding.completed`.
 *
 * # Parameters
 * - `model_id`: a model loaded through `correx_model_load` before (its descriptor is used).
 * - `inputs_json`: `{"v": 1, "inputs": ["text", ...]}`: 1 to 1,024 texts, none empty.
 * - `cancel`: optional; triggering it stops the load or the call (`CORREX_E_CANCELLED`).
 * - `out_json`: receives `{"v": 1, "model": "id", "vectors": [[0.1, ...], ...] (one per
 *   input, in input order), "prompt_tokens": 12, "latency_ms": 40}`.
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT` (bad JSON, no inputs, an empty
 * one, more than 1,024, or a model that does not serve embeddings: nothing is sent),
 * `CORREX_E_UNKNOWN_MODEL`, `CORREX_E_INFERENCE`, `CORREX_E_CANCELLED`, `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Blocks for the call (and a load if needed). Any thread; calls may run concurrently.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_embed(const struct correx_runtime *rt,
                     const char *model_id,
                     const char *inputs_json,
                     const struct correx_cancel *cancel,
                     char **out_json,
                     struct correx_error **err);

/**
 * Tokenizes `text` with the loaded model's tokenizer: `{"v": 1, "tokens": [1, 2, ...]}`.
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_MODEL` (no model is
 * loaded: nothing is sent), `CORREX_E_INFERENCE` (the server failed or did not answer within
 * 10 s), `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Blocks for one local HTTP call, at most 10 s. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_tokenize(const struct correx_runtime *rt,
                        const char *text,
                        char **out_json,
                        struct correx_error **err);

/**
 * Counts the tokens of `text` with the loaded model's tokenizer. Never fails for want of a
 * server: with no model loaded (nothing is sent), or a server that fails or does not answer
 * within 10 s, it approximates characters / 4.
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_UNUSABLE`.
 *
 * # Blocking and threads
 * Blocks for one local HTTP call. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_count_tokens(const struct correx_runtime *rt,
                            const char *text,
                            uint64_t *out_count,
                            struct correx_error **err);

/**
 * What is loaded, loading or unloading, like Ollama's `/api/ps`, sorted by model id:
 * `{"v": 1, "models": [{"model_id", "state": "loaded"|"loading"|"unloading", "pid", "port",
 * "residency", "loaded_at_ms", "idle_expires_in_ms", "in_flight", "rss_bytes",
 * "estimated_bytes"}]}` (`pid`, `port`, `loaded_at_ms`, `idle_expires_in_ms`, `rss_bytes` and
 * `estimated_bytes` may be null); a remote model also has `"endpoints": [{"url", "healthy",
 * "in_flight"}]` and no pid or port.
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Never waits for a load or an inference. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_models_status(const struct correx_runtime *rt,
                             char **out_json,
                             struct correx_error **err);

/**
 * Creates a runtime from a config JSON object.
 *
 * # Parameters
 * - `config_json`: `{"v": 1, "event_log": "/path/events.db", "durability": "full"|"normal",
 *   "sandbox_root": "/path", "tools": {"shell": {...}, "file_read": {...}, "file_write": {...},
 *   "file_edit": {...}}, "models": {"server_bin", "port", "port_count", "max_loaded",
 *   "memory_budget_mb", "max_queued", "liveness_interval_ms", "health_timeout_ms", "log_dir",
 *   "read_timeout_ms", "drain_timeout_ms", "stop_grace_ms", "session_spill_in_flight",
 *   "isolation": "required"|"best_effort"|"none"},
 *   "approvals": {"engine": "callback"|"auto"|"deny",
 *   "max_tier": 2, "rules": [{"tool", "argv_prefix", "action": "allow"|"ask"|"forbid"}]},
 *   "mcp_servers": {"name": {"command": ["/path/server", "arg"], "env", "working_dirs",
 *   "isolation", "tier", "tools": {"tool": {"tier"}}, "start": "lazy"|"open",
 *   "on_tool_change": "refuse"|"ask",
 *   "startup_timeout_ms", "call_timeout_ms", "max_call_ms", "max_line_bytes"}},
 *   "seal": {"file": "/path/log.seals", "interval_ms": 60000, "key_file": "/path/key"},
 *   "otlp": {"endpoint": "http://127.0.0.1:4318", "service_name": "correx",
 *   "queue_spans": 2048, "timeout_ms": 5000}}`. Every tool is disabled
 *   unless `"enabled": true`; empty allowlists deny everything; an MCP server's tools are
 *   `name.tool` in `correx_tools_list` and `correx_tool_execute`. docs/reference/config.md
 *   lists every field. `event_log` may instead be `"postgres://USER@HOST:PORT/DB"` in a library built
 *   with the cargo feature `postgres` (the password from `PGPASSWORD` or a password file,
 *   never the URL); a library without it refuses one with `CORREX_E_CONFIG`.
 * - `out`: receives the new runtime.
 * - `err`: optional; receives an error on failure.
 *
 * # Returns
 * `CORREX_OK`; `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT` (bad UTF-8), `CORREX_E_CONFIG` (the
 * message names the field), `CORREX_E_EVENT_STORE`, `CORREX_E_TOOL_SETUP`.
 *
 * # Memory and lifetimes
 * On success `*out` owns a runtime the caller frees with `correx_runtime_free`. On error
 * `*out` is left untouched.
 *
 * # Blocking and threads
 * Blocks while it opens the event log and recovers interrupted tool runs. Any thread.
 *
 * # Safety
 * `config_json` is NULL or NUL-terminated; `out` and `err` are NULL or valid for a write.
 */
int32_t correx_runtime_new(const char *config_json,
                           struct correx_runtime **out,
                           struct correx_error **err);

/**
 * Frees a runtime: unloads its model (stopping llama-server) and closes the event log.
 * NULL is a no-op; freeing twice is undefined behaviour. Works on an unusable runtime too.
 *
 * # Blocking and threads
 * Blocks while the server stops (at most a couple of seconds). Call it once, after every
 * other call on this runtime has returned.
 *
 * # Safety
 * `rt` is NULL or a runtime from `correx_runtime_new` not yet freed.
 */
void correx_runtime_free(struct correx_runtime *rt);

/**
 * Registers the approval callback (replacing, and releasing, any earlier one). With a NULL
 * `callback` every T2/T3 tool is denied, which is also the state of a new runtime.
 *
 * # Parameters
 * - `callback`: see `correx_approve_fn`.
 * - `user_data`: passed back to `callback`.
 * - `free_user_data`: optional; called once with `user_data` when the callback is replaced or
 *   the runtime freed (after any call in progress returned). When this call fails it is not
 *   called: the caller still owns `user_data`. Do not register the same `user_data` with a
 *   destructor twice.
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
 *
 * # Blocking and threads
 * Never blocks for long. Any thread; the callback and user_data must be usable from every
 * thread that calls `correx_tool_execute`.
 *
 * # Safety
 * `rt` is NULL or live; the callback is safe to call with `user_data` from any thread.
 */
int32_t correx_runtime_set_approver(const struct correx_runtime *rt,
                                    correx_approve_fn callback,
                                    void *user_data,
                                    correx_free_fn free_user_data,
                                    struct correx_error **err);

/**
 * Performs inference step `step` of session `session_id` once: the first call asks the
 * model (as `correx_infer_stream`) and records the answer in the stream
 * `session-{session_id}`; a later call with the same step and request, from this process or
 * another, returns the recorded answer without asking the model. A step another caller is
 * performing is waited for.
 *
 * # Parameters
 * - `session_id`, `step`: 1 to 256 bytes of UTF-8 without control characters; the host
 *   chooses the step key, unique within the session.
 * - `model_id`, `request_json`, `cancel`, `on_chunk`, `user_data`: as
 *   `correx_infer_stream` (a replayed answer comes to `on_chunk` whole: its reasoning, then
 *   its text). `on_chunk` may be NULL.
 * - `out_json`: receives `correx_infer`'s answer plus `"replayed": bool` (true when the log
 *   answered) and `"attempt"` (the try that produced it).
 *
 * # Returns
 * `CORREX_OK`; `CORREX_E_CONFLICT` when the step was recorded for another request (use a new
 * step key); `CORREX_E_INFERENCE` / `CORREX_E_CANCELLED` as `correx_infer` (nothing recorded
 * as the step's result: the next call tries again); `CORREX_E_BUSY` when a process in another
 * pid namespace holds the step; `CORREX_E_UNKNOWN_MODEL`, `CORREX_E_EVENT_STORE`,
 * `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Blocks for the generation, or while another caller performs the step (until its result,
 * or `cancel`). Any thread; steps may run concurrently. No lock is held during the model
 * call.
 *
 * # Safety
 * Pointers are NULL or valid as documented; `on_chunk` is safe to call with `user_data` on
 * this thread; `cancel` is NULL or live for the whole call.
 */
int32_t correx_session_infer(const struct correx_runtime *rt,
                             const char *session_id,
                             const char *step,
                             const char *model_id,
                             const char *request_json,
                             const struct correx_cancel *cancel,
                             correx_chunk_fn on_chunk,
                             void *user_data,
                             char **out_json,
                             struct correx_error **err);

/**
 * Performs tool step `step` of session `session_id` once, through the sandbox as
 * `correx_tool_execute_with_cancel` runs a tool (approval, backup, events): the first call
 * runs it and records its result; a later call with the same step and request returns the
 * recorded result without running it. When the host died while the run was under way, the
 * step answers with the run's recorded outcome (kind `interrupted`, with `data.state`:
 * `restored`, `unchanged`, `unknown` or `completed`) and never runs it again: the host decides whether
 * to try again under a new step key.
 *
 * # Parameters
 * - `session_id`, `step`: as `correx_session_infer`.
 * - `request_json`: `{"v": 1, "tool_name": "file_write", "parameters": {...},
 *   "call_id": "the model's tool call this answers (optional; the result joins the
 *   transcript under it)", "invocation_id": "optional, generated when absent",
 *   "wait_ms": 0}`. The step's digest covers the tool name, the parameters and the call
 *   id. `wait_ms`: how long to wait for a durable approval decision the run needs (0: do
 *   not wait).
 * - `cancel`: NULL, or a token that stops the run (as `correx_tool_execute_with_cancel`) or
 *   ends a wait for another caller's run.
 * - `out_json`: receives `correx_tool_execute`'s result plus `"replayed"`, `"attempt"` and
 *   `"recovered"` (true when the result is a dead run's recorded outcome: kind `interrupted`,
 *   `data.state` saying where its files are).
 *
 * # Returns
 * `CORREX_OK` (a tool that failed is still OK: the result says so); `CORREX_E_PENDING` when
 * the run waits for a durable approval decision (the message names the request; nothing
 * ran: decide it with `correx_approvals_decide` from any process, then call the step again);
 * `CORREX_E_CONFLICT` when the step was recorded for another request; `CORREX_E_BUSY` when
 * its owner died
 * mid-run and no recovery has closed the run yet (open a runtime on the sandbox root again),
 * or a process in another pid namespace holds it; `CORREX_E_CANCELLED` (a wait cancelled),
 * `CORREX_E_EVENT_STORE`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * As `correx_tool_execute`, or while another caller performs the step, or up to `wait_ms`
 * for an approval decision. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented; `cancel` is NULL or live for the whole call.
 */
int32_t correx_session_execute(const struct correx_runtime *rt,
                               const char *session_id,
                               const char *step,
                               const char *request_json,
                               const struct correx_cancel *cancel,
                               char **out_json,
                               struct correx_error **err);

/**
 * The conversation of session `session_id` as the log tells it, for a new process to
 * continue: `{"v": 1, "system", "task", "entries": [{"source": "user"|"model"|"tool",
 * "content", "tool_calls"?, "tool_call_id"?}]}`, the shape of `correx_infer`'s
 * `request_json.context` (each inference's context, each answer as a `model` entry with its
 * tool calls, each tool step with a call id as a `tool` entry).
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_EVENT_STORE`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_NULL`,
 * `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Reads the log: the first call on a session reads its whole stream, later ones what was
 * appended since. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_session_transcript(const struct correx_runtime *rt,
                                  const char *session_id,
                                  char **out_json,
                                  struct correx_error **err);

/**
 * Waits for a signal as step `step` of session `session_id`, once: the first call records
 * that the step waits (`session.waiting`); a signal sent from any process
 * (`correx_session_signal`) answers it, the step records its payload, and a later call with
 * the key returns that payload without waiting.
 *
 * # Parameters
 * - `session_id`, `step`: as `correx_session_infer`.
 * - `wait_json`: `{"v": 1, "name": "the signal", "wait_ms": 0}`: the name (1 to 256 bytes,
 *   no control characters) and how long to wait for it now (0: look once).
 * - `cancel`: NULL, or a token that ends the wait (`CORREX_E_CANCELLED`).
 * - `out_json`: receives `{"v": 1, "payload": <the signal's JSON>, "replayed": bool,
 *   "attempt": 1, "recovered": false}`.
 *
 * # Returns
 * `CORREX_OK`; `CORREX_E_PENDING` when no signal came within `wait_ms` (the wait is
 * recorded: call the step again, from any process, after the signal);
 * `CORREX_E_CONFLICT` when the key belongs to another step or another signal's wait;
 * `CORREX_E_CANCELLED`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_EVENT_STORE`, `CORREX_E_NULL`,
 * `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Blocks up to `wait_ms` (reading the log every few milliseconds). Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented; `cancel` is NULL or live for the whole call.
 */
int32_t correx_session_wait(const struct correx_runtime *rt,
                            const char *session_id,
                            const char *step,
                            const char *wait_json,
                            const struct correx_cancel *cancel,
                            char **out_json,
                            struct correx_error **err);

/**
 * Sends a signal to session `session_id`'s waits (recorded as `session.signaled`): every
 * wait step for its name, in any process, now or later, gets its payload. The first signal
 * of a name is the one.
 *
 * # Parameters
 * - `signal_json`: `{"v": 1, "name": "the signal", "payload": <any JSON, at most 1 MiB>,
 *   "by": "who sends it (optional, recorded)"}`.
 * - `out_json`: receives `{"v": 1, "position": N}`: where the signal is in the log.
 *
 * # Returns
 * `CORREX_OK`; `CORREX_E_CONFLICT` when a signal of the name was sent already (the message
 * says where); `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_EVENT_STORE`, `CORREX_E_NULL`,
 * `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * One append to the log. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_session_signal(const struct correx_runtime *rt,
                              const char *session_id,
                              const char *signal_json,
                              char **out_json,
                              struct correx_error **err);

/**
 * Subscribes to every event after position `after` (0: from the first event).
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_EVENT_STORE` (the log could not be opened for
 * reading), `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * On success `*out` owns a subscription freed with `correx_subscription_free`; on error it is
 * untouched. It keeps the log open until freed, also after `correx_runtime_free`.
 *
 * # Blocking and threads
 * Opens a read connection; never waits for events. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_subscribe(const struct correx_runtime *rt,
                         uint64_t after,
                         struct correx_subscription **out,
                         struct correx_error **err);

/**
 * Waits up to `timeout_ms` for the next event (0: only what is already stored).
 *
 * # Parameters
 * - `out_json`: receives the event as `correx_events_read_all` gives each one (`{"v": 1,
 *   "position", "event_id", "stream_id", "stream_version", "type_id", ..., "payload",
 *   "summary"}`), or NULL when none arrived in time.
 *
 * # Returns
 * `CORREX_OK` (also on a timeout: `*out_json` is then NULL), `CORREX_E_NULL`,
 * `CORREX_E_EVENT_STORE` (a read failed, or a stored row cannot be decoded: the subscription
 * does not move past it), `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`.
 *
 * # Blocking and threads
 * Blocks up to `timeout_ms`; an append in this process wakes it at once, one in another
 * process within about 2 ms. One thread at a time per subscription (others wait their turn).
 *
 * # Safety
 * `sub` is NULL or live; `out_json` and `err` are NULL or valid for a write.
 */
int32_t correx_subscription_next(const struct correx_subscription *sub,
                                 uint32_t timeout_ms,
                                 char **out_json,
                                 struct correx_error **err);

/**
 * The position of the last event delivered (or the one the subscription started after):
 * subscribe again after it to resume. 0 for NULL.
 *
 * # Blocking and threads
 * Waits while another thread is inside `correx_subscription_next` on the same subscription.
 *
 * # Safety
 * `sub` is NULL or live.
 */
uint64_t correx_subscription_position(const struct correx_subscription *sub);

/**
 * Frees a subscription. NULL is a no-op; freeing twice is undefined behaviour.
 *
 * # Safety
 * `sub` is NULL or a subscription from `correx_subscribe` not yet freed, with no call on it
 * running.
 */
void correx_subscription_free(struct correx_subscription *sub);

/**
 * Runs a tool through the sandbox: T2 and T3 tools ask the approval callback first; every path
 * the tool touches is backed up and restored if it fails; started / completed / failed /
 * rejected events go to the stream `session-{session_id}`.
 *
 * # Parameters
 * - `request_json`: `{"v": 1, "session_id": "s1", "tool_name": "file_write",
 *   "invocation_id": "optional, generated when absent", "parameters": {...}}`.
 * - `out_json`: receives `{"v": 1, "status": "success", "invocation_id", "output", "metadata",
 *   "data"}` or `{"v": 1, "status": "failure", "invocation_id", "reason", "recoverable",
 *   "kind", "data"}`. `kind` is stable for programs: `invalid_request`, `not_allowed`,
 *   `escape`, `not_found`, `too_large`, `symlink_loop`, `wrong_kind`, `timed_out`,
 *   `cancelled`, `non_zero_exit`, `signalled`, `io`, `interrupted`, `conflict`, `other`. `data` (absent when the tool
 *   gave none): the shell's `{"exit_code", "signal", "stdout", "stderr", "stdout_truncated",
 *   "stderr_truncated", "stdout_dropped_bytes", "stderr_dropped_bytes", "timed_out",
 *   "cancelled", "duration_ms"}` for every run, with `stdout_base64`/`stderr_base64` holding
 *   the exact bytes of output that is not UTF-8; `file_read`'s `{"entries": [{"name",
 *   "kind"}]}` (list), `{"exists": bool}`, `{"bytes", "utf8", "content_base64"?}` (read). The
 *   shell takes an optional `timeout_ms`, at most the configured timeout. A tool that fails
 *   (or is denied, or unknown) is still `CORREX_OK`: the result says so.
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_INVALID_ARGUMENT`, `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Blocks while the approver decides and the tool runs (a shell command up to its timeout).
 * Any thread; tools on different files run in parallel, on one file one after another.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_tool_execute(const struct correx_runtime *rt,
                            const char *request_json,
                            char **out_json,
                            struct correx_error **err);

/**
 * As `correx_tool_execute`, stoppable through `cancel` from any thread. Cancelled before the
 * tool starts (also while the approver decides), the run is rejected and nothing changes.
 * Cancelled while it runs: a shell run's every process is killed at once; a file tool
 * completes its one atomic change (the result then says success) or never starts it; a
 * failed or stopped run has its files restored, and `tool.execution_cancelled` is recorded.
 *
 * # Returns
 * As `correx_tool_execute`: a cancelled run is `CORREX_OK` with a `failure` result whose
 * reason says it was cancelled.
 *
 * # Blocking and threads
 * As `correx_tool_execute`; `correx_cancel_trigger` from another thread makes it return soon.
 *
 * # Safety
 * Pointers are NULL or valid as documented; `cancel` is NULL or live for the whole call.
 */
int32_t correx_tool_execute_with_cancel(const struct correx_runtime *rt,
                                        const char *request_json,
                                        const struct correx_cancel *cancel,
                                        char **out_json,
                                        struct correx_error **err);

/**
 * Lists the tools: every tool the config enabled, and the built-in ones it left disabled.
 *
 * # Parameters
 * - `out_json`: receives `{"v": 1, "tools": [{"name": "file_read", "tier": 1, "description":
 *   "...", "operations": ["read", "list", "exists"], "parameters": {JSON schema}, "enabled":
 *   true}, ...]}`, ordered by name. `parameters` can be passed as-is as a model tool's
 *   `parameters` in `correx_infer`'s `config.tools`.
 *
 * # Returns
 * `CORREX_OK`, `CORREX_E_NULL`, `CORREX_E_UNUSABLE`.
 *
 * # Memory and lifetimes
 * `*out_json` is the caller's, freed with `correx_string_free`; untouched on error.
 *
 * # Blocking and threads
 * Never blocks. Any thread.
 *
 * # Safety
 * Pointers are NULL or valid as documented.
 */
int32_t correx_tools_list(const struct correx_runtime *rt,
                          char **out_json,
                          struct correx_error **err);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* CORREX_H */
