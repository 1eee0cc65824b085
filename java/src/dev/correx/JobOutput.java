package dev.correx;

import java.util.Map;

/**
 * What a read of a job got: the output after the cursors (lossy UTF-8), the cursors to read
 * from next, the bytes written after the cursors that the job's buffer no longer held, and the
 * job's status at the read.
 */
public record JobOutput(
        String stdout, String stderr, long stdoutCursor, long stderrCursor, long stdoutDropped, long stderrDropped, JobStatus status) {

    static JobOutput from(Map<String, Object> m) {
        return new JobOutput(
                Json.str(m, "stdout"),
                Json.str(m, "stderr"),
                Json.num(m, "stdout_cursor", 0),
                Json.num(m, "stderr_cursor", 0),
                Json.num(m, "stdout_dropped", 0),
                Json.num(m, "stderr_dropped", 0),
                JobStatus.from(Json.obj(m, "status")));
    }
}
