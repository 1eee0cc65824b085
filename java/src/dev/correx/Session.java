package dev.correx;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A durable session: each step (an inference or a tool run, under a key the host chooses,
 * unique within the session) is performed once and recorded in the stream
 * {@code session-<id>}; a later call with the same key and request, from this process or
 * another, returns the recorded result without calling the model or running the tool. A
 * host that crashed mid-turn runs its loop again and continues where it stopped.
 *
 * <p>The same key with another request throws {@link ConflictException}. A tool step whose
 * host died mid-run answers with the run's recorded outcome (kind {@code interrupted},
 * {@code data.state} {@code restored}, {@code unchanged}, {@code unknown} or
 * {@code completed}) and is never
 * run again on its own: try again under a new key. Get one with {@link Runtime#session}.
 */
public final class Session {
    private final Runtime runtime;
    private final String id;

    Session(Runtime runtime, String id) {
        if (id == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "session id is null");
        }
        this.runtime = runtime;
        this.id = id;
    }

    /** The session's id. */
    public String id() {
        return id;
    }

    /** As {@link #infer(String, String, InferenceRequest, Cancellation)} without a cancellation. */
    public SessionStep<InferenceResult> infer(String step, String modelId, InferenceRequest request) {
        return infer(step, modelId, request, null);
    }

    /**
     * Inference step {@code step}: asks the model the first time, answers from the log after.
     *
     * @throws ConflictException when the key was recorded for another request
     * @throws InferenceException when the model failed (nothing recorded: the next call tries again)
     * @throws UnknownModelException when the model was never loaded through this runtime
     * @throws CancelledException when cancelled
     */
    public SessionStep<InferenceResult> infer(String step, String modelId, InferenceRequest request, Cancellation cancel) {
        byte[] s = Native.utf8(id, "session");
        byte[] k = Native.utf8(step, "step");
        byte[] m = Native.utf8(modelId, "modelId");
        byte[] r = Native.utf8(request == null ? null : request.toJson(), "request");
        byte[] out;
        try (Handle.Use u = runtime.handle.use(); Handle.Use c = Models.use(cancel)) {
            out = Native.sessionInfer(u.ptr, s, k, m, r, c == null ? 0 : c.ptr, null);
        }
        return step(Native.text(out));
    }

    /**
     * As {@link #infer(String, String, InferenceRequest, Cancellation)}, handing each piece of
     * a new answer to {@code listener} as it arrives, on this thread (a replayed answer comes
     * whole: its reasoning, then its text). A listener that returns false or throws stops the
     * generation ({@link CancelledException}); nothing is recorded, and the next call tries
     * again.
     */
    public SessionStep<InferenceResult> stream(String step, String modelId, InferenceRequest request,
                                               ChunkListener listener, Cancellation cancel) {
        byte[] s = Native.utf8(id, "session");
        byte[] k = Native.utf8(step, "step");
        byte[] m = Native.utf8(modelId, "modelId");
        byte[] r = Native.utf8(request == null ? null : request.toJson(), "request");
        if (listener == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "listener is null");
        }
        Throwable[] thrown = new Throwable[1];
        Native.ChunkBridge bridge = Models.bridge(runtime, listener, thrown);
        byte[] out;
        try (Handle.Use u = runtime.handle.use(); Handle.Use c = Models.use(cancel)) {
            out = Native.sessionInfer(u.ptr, s, k, m, r, c == null ? 0 : c.ptr, bridge);
        } catch (CancelledException e) {
            throw Models.listenerStopped(e, thrown);
        }
        return step(Native.text(out));
    }

    private static SessionStep<InferenceResult> step(String json) {
        Map<String, Object> o = Json.parseObject(json);
        return new SessionStep<>(InferenceResult.from(json), Json.bool(o, "replayed"),
                (int) Json.num(o, "attempt", 1), Json.bool(o, "recovered"));
    }

    /** As {@link #execute(String, String, Map, String, Cancellation)} without a cancellation. */
    public SessionStep<ToolResult> execute(String step, String toolName, Map<String, Object> parameters, String callId) {
        return execute(step, toolName, parameters, callId, null);
    }

    /**
     * Tool step {@code step}: runs the tool through the sandbox the first time (approval,
     * backup, events as {@link Tools#execute}), answers from the log after. {@code callId}
     * (may be null) is the model's tool call this answers: the result joins the transcript
     * under it.
     *
     * @throws ConflictException when the key was recorded for another request
     * @throws BusyException when the step's host died mid-run and no recovery has closed the
     *     run yet (open a runtime on the sandbox root again)
     * @throws PendingException when the run waits for a durable approval decision
     */
    public SessionStep<ToolResult> execute(String step, String toolName, Map<String, Object> parameters,
                                           String callId, Cancellation cancel) {
        return execute(step, toolName, parameters, callId, 0, cancel);
    }

    /**
     * As {@link #execute(String, String, Map, String, Cancellation)}, waiting up to
     * {@code waitMillis} for a durable approval decision the run needs (a decision from any
     * process starts it), then {@link PendingException}.
     */
    public SessionStep<ToolResult> execute(String step, String toolName, Map<String, Object> parameters,
                                           String callId, long waitMillis, Cancellation cancel) {
        if (toolName == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "toolName is null");
        }
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("v", 1);
        m.put("tool_name", toolName);
        m.put("parameters", parameters == null ? Map.of() : parameters);
        if (callId != null) m.put("call_id", callId);
        if (waitMillis > 0) m.put("wait_ms", waitMillis);
        byte[] s = Native.utf8(id, "session");
        byte[] k = Native.utf8(step, "step");
        byte[] r = Native.utf8(Json.write(m), "request");
        byte[] out;
        try (Handle.Use u = runtime.handle.use(); Handle.Use c = Models.use(cancel)) {
            out = Native.sessionExecute(u.ptr, s, k, r, c == null ? 0 : c.ptr);
        }
        String json = Native.text(out);
        Map<String, Object> o = Json.parseObject(json);
        return new SessionStep<>(ToolResult.from(json), Json.bool(o, "replayed"),
                (int) Json.num(o, "attempt", 1), Json.bool(o, "recovered"));
    }

    /**
     * Wait step {@code step}: waits for the signal {@code name} once. The first call records
     * that the step waits; a signal from any process ({@link #signal}) answers it, and the
     * step records its payload, which later calls with the key return ({@code replayed})
     * without waiting. Waits up to {@code waitMillis} (0: looks once); the value is the
     * signal's payload as JSON text.
     *
     * @throws PendingException when no signal came in time (call the step again later, from
     *     any process)
     * @throws ConflictException when the key belongs to another step or another signal's wait
     * @throws CancelledException when {@code cancel} ended the wait
     */
    public SessionStep<String> waitFor(String step, String name, long waitMillis, Cancellation cancel) {
        if (name == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "name is null");
        }
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("v", 1);
        m.put("name", name);
        m.put("wait_ms", Math.max(0, waitMillis));
        byte[] s = Native.utf8(id, "session");
        byte[] k = Native.utf8(step, "step");
        byte[] w = Native.utf8(Json.write(m), "wait");
        byte[] out;
        try (Handle.Use u = runtime.handle.use(); Handle.Use c = Models.use(cancel)) {
            out = Native.sessionWait(u.ptr, s, k, w, c == null ? 0 : c.ptr);
        }
        Map<String, Object> o = Json.parseObject(Native.text(out));
        return new SessionStep<>(Json.write(o.get("payload")), Json.bool(o, "replayed"),
                (int) Json.num(o, "attempt", 1), Json.bool(o, "recovered"));
    }

    /**
     * Sends the signal {@code name} with {@code payloadJson} (any JSON, at most 1 MiB) to this
     * session's waits, from any process; {@code by} (may be null) names the sender in the log.
     * Returns the signal's position in the log.
     *
     * @throws ConflictException when a signal of the name was sent already (the first wins)
     * @throws InvalidArgumentException for a bad name, sender or payload
     */
    public long signal(String name, String payloadJson, String by) {
        if (name == null || payloadJson == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "name or payloadJson is null");
        }
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("v", 1);
        m.put("name", name);
        m.put("payload", Json.parse(payloadJson));
        if (by != null) m.put("by", by);
        byte[] s = Native.utf8(id, "session");
        byte[] g = Native.utf8(Json.write(m), "signal");
        byte[] out;
        try (Handle.Use u = runtime.handle.use()) {
            out = Native.sessionSignal(u.ptr, s, g);
        }
        return Json.num(Json.parseObject(Native.text(out)), "position", 0);
    }

    /**
     * The conversation as the log tells it, as JSON in the shape of an inference request's
     * {@code context}: {@code {"v": 1, "system", "task", "entries": [{"source", "content",
     * "tool_calls"?, "tool_call_id"?}]}}. A new process continues the conversation from it.
     */
    public String transcriptJson() {
        byte[] s = Native.utf8(id, "session");
        byte[] out;
        try (Handle.Use u = runtime.handle.use()) {
            out = Native.sessionTranscript(u.ptr, s);
        }
        return Native.text(out);
    }
}
