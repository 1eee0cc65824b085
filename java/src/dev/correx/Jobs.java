package dev.correx;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The background jobs a session's shell requests started ({@code "background": true}): read
 * their output since a cursor, wait for, signal and stop them, end a session's jobs. Each job
 * is confined like any shell run; its start and end are recorded ({@code job.started},
 * {@code job.exited}); none outlives the runtime. A job id of another session is unknown.
 */
public final class Jobs {
    private final Runtime runtime;

    Jobs(Runtime runtime) {
        this.runtime = runtime;
    }

    /** The session's jobs, running and the last ended ones, oldest first. */
    public List<JobInfo> list(String session) {
        Map<String, Object> m = call(session, "list", Map.of(), null);
        return Json.objects(m, "jobs", JobInfo::from);
    }

    /**
     * A job's output after the cursors (bytes of stdout and of stderr already read), at most
     * {@code maxBytes} of each; pass the answer's cursors to the next read.
     */
    public JobOutput read(String session, String jobId, long stdoutCursor, long stderrCursor, int maxBytes) {
        Map<String, Object> p = new LinkedHashMap<>();
        p.put("job_id", jobId);
        p.put("stdout_cursor", stdoutCursor);
        p.put("stderr_cursor", stderrCursor);
        p.put("max_bytes", maxBytes);
        return JobOutput.from(call(session, "read", p, null));
    }

    /** Waits up to {@code timeoutMs} (at most 60000) for the job to end; its status then. */
    public JobStatus await(String session, String jobId, long timeoutMs, Cancellation cancel) {
        Map<String, Object> p = new LinkedHashMap<>();
        p.put("job_id", jobId);
        p.put("timeout_ms", timeoutMs);
        return JobStatus.from(Json.obj(call(session, "wait", p, cancel), "status"));
    }

    /** Sends a signal by name: TERM, INT, KILL, HUP, QUIT, USR1, USR2, STOP or CONT. */
    public void signal(String session, String jobId, String signal) {
        Map<String, Object> p = new LinkedHashMap<>();
        p.put("job_id", jobId);
        p.put("signal", signal);
        call(session, "signal", p, null);
    }

    /** Stops the job (SIGTERM, then everything killed after about 2 s); its final status. */
    public JobStatus stop(String session, String jobId) {
        Map<String, Object> p = new LinkedHashMap<>();
        p.put("job_id", jobId);
        return JobStatus.from(Json.obj(call(session, "stop", p, null), "status"));
    }

    /** Ends the session's jobs (recorded {@code session_ended}); returns once they are gone. */
    public void endSession(String session) {
        byte[] s = Native.utf8(session, "session");
        try (Handle.Use u = runtime.handle.use()) {
            Native.sessionEnd(u.ptr, s);
        }
    }

    private Map<String, Object> call(String session, String operation, Map<String, Object> params, Cancellation cancel) {
        if (session == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "session is null");
        }
        Map<String, Object> m = new LinkedHashMap<>(params);
        m.put("v", 1);
        m.put("session_id", session);
        m.put("operation", operation);
        byte[] r = Native.utf8(Json.write(m), "request");
        byte[] out;
        try (Handle.Use u = runtime.handle.use(); Handle.Use c = Models.use(cancel)) {
            out = Native.jobs(u.ptr, r, c == null ? 0 : c.ptr);
        }
        return Json.parseObject(Native.text(out));
    }
}
